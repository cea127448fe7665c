"""splitmix_ablation (Table C.3): every BN option x rescale init x Scaler row is reported beside
the paper's, and the claims read the right cells."""
from __future__ import annotations

from fedveil_reproductions import splitmix_ablation as ab
from fedveil_reproductions.splitmix_study import WIDTHS


def _results(value_of) -> ab.Results:
    return {
        (option, init, layer): {w: [value_of(option, init, layer, w)] * 2 for w in WIDTHS}
        for option in ("batch average", "tracked", "post average", "locally tracked")
        for init in (False, True) for layer in (False, True)
    }


def test_rows_cover_table_c3_and_claims_follow_the_numbers():
    study = ab.AblationStudy()

    def value(option, init, layer, w):  # the paper's pattern: init helps, Scaler breaks tracked BN
        if option in ("tracked", "locally tracked") and layer:
            return 0.1
        return 0.8 + 0.05 * init + 0.01 * (option in ("post average", "locally tracked")) + 0.01 * w

    results = _results(value)
    rows = ab.table_rows(results, study)
    assert len(rows) == 16
    assert rows[0].paper == "81.1% / 84.3% / 86.2% / 87.3%"
    assert rows[0].measured.startswith("0.8013 / 0.8025 / 0.8050 / 0.8100")
    verdicts = {r.metric: r.verdict for r in ab.claim_rows(results, study)}
    assert verdicts == {
        "(a) rescaled init above default init": "holds",
        "(b) post average >= batch average": "holds",
        "(c) the Scaler breaks tracked BN": "holds",
        "(d) locally tracked >= globally tracked": "holds",
    }
    flipped = _results(lambda option, init, layer, w: 0.9 - 0.05 * init)
    verdicts = {r.metric: r.verdict for r in ab.claim_rows(flipped, study)}
    assert verdicts["(a) rescaled init above default init"] == "does not hold"
