"""The README stays true: set-up commands, CI command, vocabularies and thresholds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from torchtriage.analysis.categories import CPU_CATEGORIES, GPU_CATEGORIES
from torchtriage.diagnosis import thresholds as th
from torchtriage.diagnosis.catalog import CATALOG
from torchtriage.diagnosis.vocabulary import LAYERS
from torchtriage.results.ab import AB_VERDICTS, PARITY_STATUSES, TRIAL_STATUSES
from torchtriage.results.fix import STEP_RESULTS
from torchtriage.results.registry import DOCUMENTS
from torchtriage.verify import policy
from torchtriage.verify.store import RUN_KINDS

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()


def _quickstart() -> list[str]:
    block = README.split("## Quickstart", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    return [line for line in block.strip().splitlines() if line.strip()]


def test_exactly_two_setup_commands_and_ci_runs_the_test_one():
    install, test = _quickstart()
    assert install.startswith("pip install torch==2.13.0 && ") and "torchtriage demo" in install
    ci = (REPO / ".ci" / "run").read_text()
    assert test in ci.splitlines()
    assert ci.index("pip install --quiet torch==2.13.0") < ci.index(test)


def test_every_id_is_documented():
    for r in CATALOG:
        assert f"`{r.id}`" in README, r.id
    for t in th.ALL:
        assert f"`{t.name}`" in README, t.name
    for name in (*LAYERS, *GPU_CATEGORIES, *CPU_CATEGORIES):
        assert f"`{name}`" in README, name


def test_architecture_names_every_package_folder():
    arch = README.split("## Architecture", 1)[1]
    for folder in sorted(p.name for p in (REPO / "src" / "torchtriage").iterdir()
                         if p.is_dir() and not p.name.startswith("_")):
        assert re.search(rf"\b{folder}/", arch), folder


@pytest.mark.parametrize("document", DOCUMENTS)
def test_committed_json_schemas_match_the_code(document):
    import json

    from torchtriage.results.registry import json_schema

    committed = json.loads((REPO / "docs" / f"{document}.schema.json").read_text())
    assert committed == json_schema(document), \
        f"run: torchtriage schema {document} > docs/{document}.schema.json"
    assert f"docs/{document}.schema.json" in README


def test_diagnosis_schema_has_the_core_fields():
    import json

    committed = json.loads((REPO / "docs" / "diagnosis.schema.json").read_text())
    diagnosis = committed["$defs"]["Diagnosis"]
    assert {"primary", "layers", "breakdown"} <= set(diagnosis["required"])
    assert {"schema", "findings", "prescriptions"} <= set(diagnosis["properties"])


def test_verification_vocabularies_and_defaults_are_documented():
    for t in policy.ALL:
        assert f"`{t.name}`" in README, t.name
    for word in (*AB_VERDICTS, *TRIAL_STATUSES, *PARITY_STATUSES, *RUN_KINDS, *STEP_RESULTS):
        assert f"`{word}`" in README, word
