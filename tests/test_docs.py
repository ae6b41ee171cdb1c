"""The docs stay true: set-up commands, CI command, vocabularies, thresholds, schemas and links.

Which page holds what (each check below looks there):

- README.md: the pitch, the Quickstart (whose second command CI runs verbatim), one example per
  mode, the layers, why each dependency; at most 300 lines, no reference tables.
- docs/reference.md: every prescription id, layer and breakdown category; links to every
  committed JSON Schema and to docs/thresholds.md.
- docs/thresholds.md: generated from the thresholds and verification defaults in the code
  (``TORCHTRIAGE_UPDATE_DOCS=1`` rewrites it, and the committed schemas, instead of failing).
- docs/usage.md + docs/reference.md together: the verification vocabularies and knob ids.
- docs/architecture.md: every package folder.
- README.md and docs/*.md: every relative link resolves, anchors included.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import msgspec
import pytest

from torchtriage.analysis.categories import CPU_CATEGORIES, GPU_CATEGORIES
from torchtriage.diagnosis import thresholds as th
from torchtriage.diagnosis.catalog import CATALOG
from torchtriage.diagnosis.knobs import KNOBS
from torchtriage.diagnosis.vocabulary import LAYERS
from torchtriage.report.reference import thresholds_markdown
from torchtriage.results.ab import AB_VERDICTS, PARITY_STATUSES, TRIAL_STATUSES
from torchtriage.results.fix import STEP_RESULTS
from torchtriage.results.registry import DOCUMENTS, json_schema
from torchtriage.verify import policy
from torchtriage.verify.store import RUN_KINDS

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
README = (REPO / "README.md").read_text()
UPDATE = os.environ.get("TORCHTRIAGE_UPDATE_DOCS") == "1"
PAGES = [REPO / "README.md", *sorted(DOCS.glob("*.md"))]


def _page(name: str) -> str:
    return (DOCS / name).read_text()


def _quickstart() -> list[str]:
    block = README.split("## Quickstart", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    return [line for line in block.strip().splitlines() if line.strip()]


def test_quickstart_clones_installs_tests_and_ci_runs_the_test_command():
    clone, install, test = _quickstart()
    assert clone.startswith("git clone ") and clone.endswith("&& . .venv/bin/activate")
    assert install.startswith("pip install torch==2.13.0 && ") and "torchtriage demo" in install
    ci = (REPO / ".ci" / "run").read_text()
    assert test in ci.splitlines()
    assert ci.index("pip install --quiet torch==2.13.0") < ci.index(test)


def test_quickstart_warns_of_the_cuda_wheel_before_the_commands_and_says_what_next():
    quickstart = README.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    commands = quickstart.index("```bash")
    assert quickstart.index("--index-url https://download.pytorch.org/whl/cpu") < commands
    after = quickstart[commands:]
    assert after.index("torchtriage demo") < after.index("torchtriage run -- python train.py") \
        < after.index("torchtriage fix -- python train.py")


def test_readme_is_at_most_300_lines():
    assert len(README.splitlines()) <= 300


def test_readme_says_why_each_dependency():
    why = README.split("## Why these libraries", 1)[1].split("\n## ", 1)[0].lower()
    pyproject = (REPO / "pyproject.toml").read_text()
    block = re.search(r"^dependencies = \[(.*?)^\]", pyproject, re.S | re.M).group(1)
    for name in re.findall(r'"([A-Za-z0-9_.-]+)', block):
        assert name.lower() in why, name


def test_every_id_is_documented():
    reference = _page("reference.md")
    for r in CATALOG:
        assert f"`{r.id}`" in reference, r.id
    for name in (*LAYERS, *GPU_CATEGORIES, *CPU_CATEGORIES):
        assert f"`{name}`" in reference, name


def test_readme_names_every_layer():
    for name in LAYERS:
        assert f"`{name}`" in README, name


THRESHOLDS_HEADER = (
    "# Thresholds and defaults\n\n"
    "Generated from `src/torchtriage/diagnosis/thresholds.py` and "
    "`src/torchtriage/verify/policy.py`; do not edit. Regenerate: "
    "`TORCHTRIAGE_UPDATE_DOCS=1 python -m pytest -q tests/test_docs.py`. "
    "How each is used: [reference](reference.md).\n\n"
)


def test_thresholds_page_is_generated_from_the_code():
    expected = THRESHOLDS_HEADER + thresholds_markdown([
        ("Diagnosis thresholds (`diagnosis/thresholds.py`)", th.ALL),
        ("Verification defaults (`verify/policy.py`)", policy.ALL),
    ])
    for t in (*th.ALL, *policy.ALL):
        assert f"| `{t.name}` |" in expected, t.name
    page = DOCS / "thresholds.md"
    if UPDATE:
        page.write_text(expected)
    assert page.read_text() == expected, \
        "run: TORCHTRIAGE_UPDATE_DOCS=1 python -m pytest -q tests/test_docs.py"
    assert "](thresholds.md)" in _page("reference.md")


def test_architecture_names_every_package_folder():
    arch = _page("architecture.md")
    for folder in sorted(p.name for p in (REPO / "src" / "torchtriage").iterdir()
                         if p.is_dir() and not p.name.startswith("_")):
        assert re.search(rf"\b{folder}/", arch), folder


@pytest.mark.parametrize("document", DOCUMENTS)
def test_committed_json_schemas_match_the_code(document):
    path = DOCS / f"{document}.schema.json"
    if UPDATE:
        path.write_text(msgspec.json.format(msgspec.json.encode(json_schema(document))).decode()
                        + "\n")
    committed = json.loads(path.read_text())
    assert committed == json_schema(document), \
        f"run: torchtriage schema {document} > docs/{document}.schema.json"


@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_schema_is_linked_from_the_reference(document):
    targets = {target for target, _ in _links(_page("reference.md"))}
    assert f"{document}.schema.json" in targets, document


def test_diagnosis_schema_has_the_core_fields():
    committed = json.loads((DOCS / "diagnosis.schema.json").read_text())
    diagnosis = committed["$defs"]["Diagnosis"]
    assert {"primary", "layers", "breakdown"} <= set(diagnosis["required"])
    assert {"schema", "findings", "prescriptions"} <= set(diagnosis["properties"])


def test_verification_vocabularies_are_documented():
    text = _page("usage.md") + _page("reference.md")
    for word in (*AB_VERDICTS, *TRIAL_STATUSES, *PARITY_STATUSES, *RUN_KINDS, *STEP_RESULTS):
        assert f"`{word}`" in text, word


def test_every_knob_is_documented():
    text = _page("usage.md") + _page("reference.md")
    for knob_id in (k.id for k in KNOBS):
        assert f"`{knob_id}`" in text, knob_id


# --- links --------------------------------------------------------------------------------

_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    return _FENCE.sub("", text)


def _links(text: str) -> list[tuple[str, str]]:
    """(target file, anchor) of every relative link outside code blocks."""
    out = []
    for target in _LINK.findall(_prose(text)):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        out.append((path, anchor))
    return out


def _anchors(text: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    seen: dict[str, int] = {}
    anchors = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *$", _prose(text), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_relative_links_resolve(page):
    for path, anchor in _links(page.read_text()):
        target = (page.parent / path).resolve() if path else page
        assert target.exists(), f"{page.name}: {path} does not exist"
        if anchor and target.suffix == ".md":
            assert anchor in _anchors(target.read_text()), f"{page.name}: {path}#{anchor}"
