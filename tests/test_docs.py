"""The docs that are generated from code must be current."""
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_config_reference_is_current():
    spec = importlib.util.spec_from_file_location("gen_config_doc", ROOT / "scripts" / "gen_config_doc.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.DOC_PATH.read_text() == module.render(), "run `python scripts/gen_config_doc.py`"
    assert "`noise_multiplier`" in module.render()


def test_the_python_examples_of_your_model_and_data_run(tmp_path, monkeypatch):
    pytest.importorskip("datasets")
    """docs/your-model-and-data.md's python blocks run as written (from an empty folder, the
    repository's example configs by absolute path); the model they register is unregistered after."""
    import re
    import warnings

    from fedveil.models import MODELS

    text = (ROOT / "docs" / "your-model-and-data.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", text, re.M | re.S)
    assert len(blocks) == 4
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    before = {e.name for e in MODELS.entries()}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for block in blocks:
                exec(block.replace('"examples/', f'"{ROOT}/examples/'), namespace)
        assert namespace["summary"]["model"].endswith(":TinyNet")
        assert (tmp_path / "runs" / "tinynet" / "summary.json").exists()
        assert "tinynet" in {e.name for e in MODELS.entries()}
        assert 0 < namespace["images_summary"]["epsilon"] <= 8.0 * (1 + 1e-6)
        assert namespace["images_summary"]["model"].endswith(":SmallCNN")
        assert namespace["images_summary"]["global_test_accuracy"] > 0.6  # 0.861 when written (seeded)
        assert namespace["hf_summary"]["global_test_accuracy"] > 0.6  # 0.897 when written (seeded)
    finally:
        for name in {e.name for e in MODELS.entries()} - before:
            MODELS._entries.pop(name)


def test_the_python_api_example_of_privacy_runs():
    """docs/privacy.md's python block runs as written; its calibrations meet their targets."""
    import re

    from fedveil.privacy import epsilon

    blocks = re.findall(r"^```python\n(.*?)^```", (ROOT / "docs" / "privacy.md").read_text(), re.M | re.S)
    assert len(blocks) == 1
    namespace: dict = {}
    exec(blocks[0], namespace)
    z = namespace["calibrate"](namespace["steps"], target_epsilon=3.0, delta=1e-5)
    assert epsilon(z, 0.01, 1_000, 1e-5) <= 3.0 < epsilon(z * 0.999, 0.01, 1_000, 1e-5)
    assert 0 < namespace["ledger"].epsilon("hospital-a", delta=1e-5) < 10
