"""What docs/model_parallel.md quotes of a run's output, checked against the code.

The numbers_to_words cut table is what `--strategy pipeline --devices 2` prints at the
recipe's default sizes (#48: the doc said 43% / 57% after the decoder embeddings while
the run printed 50% / 50% with `dec_0_self_attn` on CPU:0). The same split, on one
device twice (the cut depends on the parameters, not on the devices).
"""

from __future__ import annotations

import os
import re

from tests.conftest import REPO


def _doc_rows() -> list[tuple[str, int, int]]:
    """(first cell, params, percent) of each row of the doc's numbers_to_words cut table."""
    text = open(os.path.join(REPO, "docs", "model_parallel.md"), encoding="utf-8").read()
    section = text[text.index("## The Transformer (numbers_to_words), split into 2 stages"):]
    rows = re.findall(r"^\| (.+) \| CPU:(\d) \| ([\d,]+) \((\d+)%\) \|$", section[:3000], re.M)
    return [(cells, int(params.replace(",", "")), int(pct)) for cells, _, params, pct in rows]


def test_the_transformer_cut_table_is_what_the_split_prints():
    from tfdist import recipe as recipe_lib
    from tfdist.model_parallel import pipeline

    recipe = recipe_lib.load("numbers_to_words")
    model = recipe.build_model(dict(recipe.DEFAULTS))
    split = pipeline.split(model, ["/cpu:0", "/cpu:0"], microbatches=4, schedule="gpipe")
    stages = [[layer.name for layer in stage] for stage in split.stage_layers]
    params = [sum(layer.count_params() for layer in stage) for stage in split.stage_layers]
    rows = _doc_rows()
    assert len(rows) == 2 == len(stages)
    for (cells, doc_params, pct), names, count in zip(rows, stages, params):
        assert doc_params == count, (cells, count)
        assert pct == round(100 * count / sum(params)), (cells, count)
    # Each stage's first and last layers are named in its row; the other's are not.
    for (cells, _, _), names, other in zip(rows, stages, stages[::-1]):
        assert f"`{names[0]}`" in cells and f"`{names[-1]}`" in cells, (cells, names)
        assert f"`{other[0]}`" not in cells and f"`{other[-1]}`" not in cells, (cells, other)
