"""The layers, as import contracts over the installed package (grimp's graph of every import,
function-level ones included; imports under ``TYPE_CHECKING`` do not run and are left out):
what a layer may not import, and no import circle anywhere."""

from __future__ import annotations

from dataclasses import dataclass

import grimp
import pytest

ROOTS = ("evenflow.server", "evenflow.balancer", "evenflow.client", "evenflow.loadtest",
         "evenflow.proto")


@dataclass(frozen=True)
class Forbidden:
    """``importer`` (a package or module, with everything under it) imports none of ``imported``,
    directly or through other modules."""

    importer: str
    imported: tuple[str, ...]
    why: str


CONTRACTS = (
    Forbidden("evenflow.balancer", ("grpc", "torch", "evenflow.server", "evenflow.client"),
              "the balancer is policy: it is driven in virtual time and imports no transport, "
              "no framework and nothing of the server"),
    Forbidden("evenflow.server.edge", ("torch", "evenflow.server.engine",
                                       "evenflow.server.workers", "evenflow.server.processes"),
              "the edge is what a front-end process imports: torch-free, nothing of the engine"),
    Forbidden("evenflow.server.processes.frontend_process",
              ("torch", "evenflow.server.engine", "evenflow.server.workers",
               "evenflow.server.models.repository", "evenflow.server.processes.frontend_pool",
               "evenflow.server.observability.metrics"),
              "a front-end process is lean: the edge and the IPC messages, nothing of the engine"),
)


def build_graph() -> grimp.ImportGraph:
    return grimp.build_graph(*ROOTS, include_external_packages=True,
                             exclude_type_checking_imports=True)


def violations(graph: grimp.ImportGraph, contract: Forbidden) -> list[tuple[str, ...]]:
    """One import chain per forbidden package the importer reaches."""
    found = []
    for imported in contract.imported:
        if imported not in graph.modules:
            continue
        chain = _shortest_chain(graph, contract.importer, imported)
        if chain:
            found.append(chain)
    return found


def _shortest_chain(graph: grimp.ImportGraph, importer: str,
                    imported: str) -> tuple[str, ...] | None:
    chains = graph.find_shortest_chains(importer=importer, imported=imported, as_packages=True)
    return min(chains, key=len) if chains else None


def cycles(graph: grimp.ImportGraph) -> set[tuple[str, ...]]:
    """Every import circle between the project's modules, as its shortest chain back."""
    found = set()
    ours = {m for m in graph.modules if m.startswith("evenflow.")}
    for module in ours:
        for imported in graph.find_modules_directly_imported_by(module) & ours:
            back = graph.find_shortest_chain(importer=imported, imported=module)
            if back:
                found.add(tuple(sorted(set(back))))
    return found


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return build_graph()


def test_the_graph_sees_the_package(graph: grimp.ImportGraph) -> None:
    # A graph of nothing would satisfy every contract.
    assert {"evenflow.balancer.balancer", "evenflow.server.edge.servicer", "grpc",
            "torch"} <= graph.modules


@pytest.mark.parametrize("contract", CONTRACTS, ids=lambda c: c.importer)
def test_layer_imports_nothing_forbidden(graph: grimp.ImportGraph, contract: Forbidden) -> None:
    assert violations(graph, contract) == [], contract.why


def test_no_import_circles(graph: grimp.ImportGraph) -> None:
    assert cycles(graph) == set()


def test_a_violation_is_reported_with_its_chain() -> None:
    graph = grimp.ImportGraph()
    graph.add_module("evenflow.balancer")
    graph.add_import(importer="evenflow.balancer.replica", imported="evenflow.balancer.job")
    graph.add_import(importer="evenflow.balancer.job", imported="torch")
    graph.add_import(importer="evenflow.server.edge.servicer", imported="grpc")
    (balancer, *_) = CONTRACTS
    assert violations(graph, balancer) == [
        ("evenflow.balancer.job", "torch")]


def test_a_circle_is_reported() -> None:
    graph = grimp.ImportGraph()
    graph.add_import(importer="evenflow.server.a", imported="evenflow.server.b")
    graph.add_import(importer="evenflow.server.b", imported="evenflow.server.c")
    graph.add_import(importer="evenflow.server.c", imported="evenflow.server.a")
    graph.add_import(importer="evenflow.server.c", imported="evenflow.server.d")
    assert cycles(graph) == {("evenflow.server.a", "evenflow.server.b", "evenflow.server.c")}
