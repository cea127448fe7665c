"""The docs that are generated from code must be current."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_config_reference_is_current():
    spec = importlib.util.spec_from_file_location("gen_config_doc", ROOT / "scripts" / "gen_config_doc.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.DOC_PATH.read_text() == module.render(), "run `python scripts/gen_config_doc.py`"
    assert "`noise_multiplier`" in module.render()
