"""The rooms and who may import whom (issue 30; docs/architecture.md).

Every import of the project's own modules counts, also those inside functions (a lazy import
that closes a circle is still a circle):

- no import circle among the project's modules, nor with each sub-package of a room taken as
  one (``fedowen_task.backdoor`` importing ``fedowen_task.adversary.keys`` while
  ``fedowen_task.adversary.client`` imports it back is a circle, though no module imports
  itself);
- the ClientApp imports nothing from the ServerApp or the strategy library (the two apps share
  only the task module, ``fedowen_task``);
- the strategy library takes only the message protocol and the run-config key declaration
  (pure Python) from the task module;
- the valuation library imports neither Flower nor torch (numpy only);
- nothing under ``sim/`` (the experiments' harness) or ``studies/`` (the studies) is imported by
  the product (``fedowen_strategy``, ``fedowen_task``, ``client_app``, ``server_app``,
  ``fedowen_deploy``) or run by ``docker/``;
- ``sim/`` is the harness alone (issue 61): its files are the ones listed here, and none of them
  imports a study or names one (the report finds the studies' sections by the names
  ``pyproject.toml`` declares, :mod:`sim.sections`).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("fedowen_strategy", "fedowen_task", "client_app", "server_app", "fedowen_deploy")
EXPERIMENTS = ("sim", "studies")
ROOMS = (*PRODUCT, *EXPERIMENTS)
#: The harness (sim/): grids, presets, runner, records, backends, report skeleton, stats. A new
#: module here is harness or belongs in a study's folder under studies/.
HARNESS = {
    "__init__", "archives", "carry", "cell_state", "cluster", "cluster_task", "compact",
    "experiments", "experiments_args", "fit", "follow", "grid", "inline", "inline_grid", "ledger",
    "local_cluster", "plots", "presets", "report", "results", "run", "runner", "sections", "stats",
}
#: The names the studies' modules had in sim/ before issue 61: no harness file names them again.
FORMER = ("ablation", "ablation_data", "adversarial", "adversary_stats", "attack_costs",
          "backdoor", "collapse", "confirm2_picks", "confirmation", "confirmation_sections",
          "hypotheses", "protocol", "robustness", "selection_dev", "selection_sizes",
          "sybil_links", "tuning", "writer_coverage")


def module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the rooms."""
    out = {}
    for room in ROOMS:
        for path in (ROOT / room).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports (at any depth of its code)."""
    files = module_files()

    def resolve(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [f"{node.module}.{alias.name}" for alias in node.names]
            deps.update(found for name in names if (found := resolve(name)))
        graph[module] = deps - {module}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                found.append(sorted([v, *component]))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The import graph with each sub-package of a room taken as one node (``fedowen_task.
    adversary``, ``fedowen_strategy.valuation``); a room's own modules stay apart (its
    ``__init__`` and top modules are the hall every sub-package may use)."""
    files = module_files()

    def node(module: str) -> str:
        head = ".".join(module.split(".")[:2])
        return head if head in files and files[head].name == "__init__.py" else module

    nodes: dict[str, set[str]] = {}
    for module, deps in graph.items():
        nodes.setdefault(node(module), set()).update(node(d) for d in deps)
    return {n: deps - {n} for n, deps in nodes.items()}


def room(module: str) -> str:
    return module.split(".", 1)[0]


def test_no_import_circle() -> None:
    assert circles(import_graph()) == []


def test_no_import_circle_among_packages() -> None:
    assert circles(package_graph(import_graph())) == []


def test_the_circle_finder_finds_a_lazy_circle() -> None:
    assert circles({"a.x": {"a.y"}, "a.y": {"a.x"}, "b": {"a.x"}}) == [["a.x", "a.y"]]


def test_the_apps_share_only_the_task_module() -> None:
    graph = import_graph()
    client = {dep for m, deps in graph.items() if room(m) == "client_app" for dep in deps}
    assert {room(d) for d in client} <= {"client_app", "fedowen_task"}, sorted(client)
    library = {dep for m, deps in graph.items() if room(m) == "fedowen_strategy"
               for dep in deps if room(dep) != "fedowen_strategy"}
    assert library <= {"fedowen_task.protocol", "fedowen_task.declare"}, sorted(library)


def test_the_product_never_imports_the_experiments() -> None:
    graph = import_graph()
    leaks = sorted(f"{m} -> {d}" for m, deps in graph.items() if room(m) in PRODUCT
                   for d in deps if room(d) in EXPERIMENTS)
    assert leaks == []
    docker = " ".join(p.read_text() for p in (ROOT / "docker").iterdir() if p.is_file())
    assert not re.search(r"\b(sim|studies)[./]", docker)


def test_sim_is_the_harness_alone_and_names_no_study() -> None:
    # the harness's files are these (a study's module goes to studies/<study>/), with no
    # sub-package; none imports a study (also lazily) or names one: not the studies' package,
    # not a study module's path, not a name a study module had in sim/
    sim = ROOT / "sim"
    assert {p.stem for p in sim.glob("*.py")} == HARNESS
    assert not [p for p in sim.iterdir() if p.is_dir() and p.name != "__pycache__"]
    graph = import_graph()
    assert sorted(f"{m} -> {d}" for m, deps in graph.items() if room(m) == "sim"
                  for d in deps if room(d) == "studies") == []
    studies = {p.relative_to(ROOT).with_suffix("").as_posix()
               for p in (ROOT / "studies").rglob("*.py")}
    named = re.compile(rf"\bstudies\b|\bsim[./]({'|'.join(FORMER)})\b")
    for path in sim.glob("*.py"):
        text = path.read_text()
        found = [m.group(0) for m in named.finditer(text)]
        found += [s for s in studies if s.replace("/", ".") in text or s + ".py" in text]
        assert found == [], f"{path.name} names a study: {found}"


def test_every_module_compose_runs_is_in_the_image() -> None:
    # compose runs `python -m <module>` in the app image, which holds no FAB: the Dockerfile
    # must copy the module (and the image's .dockerignore let it through)
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    ignore = (ROOT / ".dockerignore").read_text().splitlines()  # docker/Dockerfile's context
    modules = {m for p in (ROOT / "docker").glob("compose*.yml")
               for m in re.findall(r"\[python, -m, ([\w.]+)\]", p.read_text())}
    assert modules, "no compose service runs a module of this repository"
    for module in modules:
        path = module.replace(".", "/") + ".py"
        assert (ROOT / path).is_file() and path in dockerfile and f"!{path}" in ignore, module


def test_the_valuation_library_needs_neither_flower_nor_torch() -> None:
    # a fresh interpreter: this one has imported both already
    probe = ("import sys, fedowen_strategy.valuation, fedowen_strategy.round.contribution; "
             "print(sorted(m for m in ('flwr', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"
