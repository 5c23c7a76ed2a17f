"""Running supersteps: the step algebra (``_algo``: where a message goes, the next inbox; no
I/O), one superstep (``_superstep``, handed its run's ``RunScope``, never the run), the loop that
drives a run and closes every superstep with one marker (``_runner``, with ``_writer``, ``_tasks``
and ``_result``), the stream's emitters (``_emit``), the hook seam (``_hooks``), the runner's one
collaborator (``_instance``: ``RunnerContext``), the checkpoints a continuation starts from
(``_ledger``), the recorded steps a retry is served (``_steps``: ``StepBook``, ``StepsHost``)
and the snapshots of an instance's folded view kept beside the log (``_snapshot``).
Imports ``_define``, ``_store``, ``_codec``, ``_log`` and ``_base``."""
