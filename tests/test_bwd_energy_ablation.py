"""scripts/bwd_energy_ablation.py's text changes still apply to the templates, so that a template edit which breaks
an ablation fails here rather than on the device."""
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("bwd_energy_ablation", ROOT / "scripts" / "bwd_energy_ablation.py")
ablation = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ablation)


@pytest.mark.parametrize("name", sorted(ablation.ABLATIONS))
def test_ablation_changes_apply_to_the_templates(name):
    texts = ablation.ablated_templates(name)
    assert (texts == {}) == (name == "base")
    for file, text in texts.items():
        assert text != (ROOT / ablation.T / file).read_text(), f"{name} leaves {file} as it is"


def test_a_changed_template_is_named(tmp_path):
    (tmp_path / "bwd_dq.cuh").write_text("// store_or_add_dq(...) was renamed\n")
    with pytest.raises(ValueError, match="dq_add: bwd_dq.cuh has 0 occurrences"):
        ablation.ablated_templates("dq_add", templates=tmp_path)
