"""Agent Framework's graph sample ``parallelism/map_reduce_and_visualization``, ported.

The test re-tells the AF 1.23 sample in its own words, importing from ``kernel`` instead of
``agent_framework``; every line that had to change beyond the import is marked ``# port:``. A
word count runs as map-reduce over files (split -> three mappers -> shuffle -> four reducers ->
completion, fan-out and fan-in between), the graph is printed as Mermaid and DOT and exported as
SVG (``except ImportError`` when Graphviz is missing, as the sample does), and the streamed
output names the reducers' files, whose totals are the text's word counts.
"""

from __future__ import annotations

import ast
import asyncio
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Never

from kernel import (  # port: was `from agent_framework import ...`
    Executor,
    WorkflowBuilder,
    WorkflowContext,
    WorkflowViz,
    handler,
    open_store,
)

WORDS = "words"
TEXT = """
the quick brown fox jumps over the lazy dog
the dog sleeps and the fox runs

a quick brown dog and a lazy fox
"""


def read_lines(path: str | Path) -> list[str]:
    """The lines of a small file (the sample reads and writes its files synchronously too)."""
    return Path(path).read_text().splitlines()


def write(path: Path, text: str) -> None:
    path.write_text(text)


def remove(path: str) -> None:
    Path(path).unlink()


@dataclass  # port: a plain class is not storable; the sample's marker has no fields either
class SplitDone:
    pass


@dataclass
class Mapped:
    path: str


@dataclass
class Shuffled:
    path: str
    reducer: str


@dataclass
class Reduced:
    path: str


class Splitter(Executor):
    """Keeps the words in state and gives each mapper a slice of them."""

    def __init__(self, id: str, mappers: list[str]) -> None:
        super().__init__(id)
        self.mappers = mappers

    @handler
    async def split(self, text: str, ctx: WorkflowContext[SplitDone]) -> None:
        words = text.split()
        ctx.set_state(WORDS, words)
        size = len(words) // len(self.mappers)

        async def assign(i: int) -> None:
            end = len(words) if i == len(self.mappers) - 1 else (i + 1) * size
            ctx.set_state(self.mappers[i], (i * size, end))
            await ctx.send_message(SplitDone(), self.mappers[i])

        await asyncio.gather(*(asyncio.create_task(assign(i)) for i in range(len(self.mappers))))


class Mapper(Executor):
    def __init__(self, id: str, tmp: Path) -> None:
        super().__init__(id)
        self.tmp = tmp

    @handler
    async def map(self, _: SplitDone, ctx: WorkflowContext[Mapped]) -> None:
        start, end = ctx.get_state(self.id)
        path = self.tmp / f"map_{self.id}.txt"
        write(path, "".join(f"{word}: 1\n" for word in ctx.get_state(WORDS)[start:end]))
        await ctx.send_message(Mapped(str(path)))


class Shuffler(Executor):
    """Groups the mappers' pairs by word and writes one partition per reducer."""

    def __init__(self, id: str, reducers: list[str], tmp: Path) -> None:
        super().__init__(id)
        self.reducers = reducers
        self.tmp = tmp

    @handler
    async def shuffle(self, done: list[Mapped], ctx: WorkflowContext[Shuffled]) -> None:
        grouped: defaultdict[str, list[int]] = defaultdict(list)
        for mapped in done:
            for line in read_lines(mapped.path):
                word, count = line.split(": ")
                grouped[word].append(int(count))
        pairs = sorted(grouped.items())
        share, extra = divmod(len(pairs), len(self.reducers))
        parts = [pairs[i * share : (i + 1) * share] for i in range(len(self.reducers))]
        parts[-1].extend(pairs[len(pairs) - extra :] if extra else [])

        async def partition(i: int) -> None:
            path = self.tmp / f"shuffle_{i}.txt"
            write(path, "".join(f"{word}: {counts}\n" for word, counts in parts[i]))
            await ctx.send_message(Shuffled(str(path), self.reducers[i]))

        await asyncio.gather(*(asyncio.create_task(partition(i)) for i in range(len(parts))))


class Reducer(Executor):
    def __init__(self, id: str, tmp: Path) -> None:
        super().__init__(id)
        self.tmp = tmp

    @handler
    async def reduce(self, part: Shuffled, ctx: WorkflowContext[Reduced]) -> None:
        if part.reducer != self.id:
            return  # every reducer hears of every partition; this one is another's
        totals = {}
        for line in read_lines(part.path):
            word, counts = line.split(": ")
            totals[word] = sum(ast.literal_eval(counts))
        path = self.tmp / f"reduced_{self.id}.txt"
        write(path, "".join(f"{word}: {total}\n" for word, total in totals.items()))
        await ctx.send_message(Reduced(str(path)))


class Completion(Executor):
    @handler
    async def complete(self, done: list[Reduced], ctx: WorkflowContext[Never, list[str]]) -> None:
        await ctx.yield_output([reduced.path for reduced in done])


async def test_map_reduce_and_visualization(store_url: str, tmp_path: Path) -> None:
    mappers = [Mapper(f"map_executor_{i}", tmp_path) for i in range(3)]
    reducers = [Reducer(f"reduce_executor_{i}", tmp_path) for i in range(4)]
    split = Splitter("split_data_executor", [m.id for m in mappers])
    shuffle = Shuffler("shuffle_executor", [r.id for r in reducers], tmp_path)
    completion = Completion("completion_executor")
    workflow = (
        WorkflowBuilder(start_executor=split, store=open_store(store_url))  # port: store=
        .add_fan_out_edges(split, mappers)
        .add_fan_in_edges(mappers, shuffle)
        .add_fan_out_edges(shuffle, reducers)
        .add_fan_in_edges(reducers, completion)
        .build()
    )

    viz = WorkflowViz(workflow)
    mermaid, dot = viz.to_mermaid(), viz.to_digraph()
    assert mermaid.count("((fan-in))") == 2
    assert 'split_data_executor["split_data_executor (Start)"];' in mermaid
    assert dot.count('label="fan-in"') == 2
    assert '"split_data_executor" -> "map_executor_0";' in dot
    try:
        svg = viz.export(format="svg")
        assert read_lines(svg)[0].startswith("<?xml")
        remove(svg)  # a temporary file the sample leaves behind
    except ImportError:
        pass  # the sample prints a tip; Graphviz is not installed

    outputs = []
    async for event in workflow.run(TEXT, stream=True):
        if event.type == "output":
            outputs.append(event.data)
    (paths,) = outputs
    totals: Counter[str] = Counter()
    for path in paths:
        for line in read_lines(path):
            word, total = line.split(": ")
            totals[word] += int(total)
    assert totals == Counter(TEXT.split())
    assert len(paths) == 4
