"""Write examples/data/clinics.csv: a synthetic stand-in for a consortium's patient table
(600 rows, three clinics with shifted populations), used by examples/clinics_table.toml
and docs/your-model-and-data.md. Deterministic: ``python scripts/make_clinics_csv.py`` rewrites the
same file."""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parents[1] / "examples" / "data" / "clinics.csv"


def main() -> None:
    rng = np.random.default_rng(2026)
    rows = []
    for clinic, (age_mean, smoke_rate, n) in {"north": (48, 0.2, 240), "river": (58, 0.35, 200), "coast": (66, 0.15, 160)}.items():
        for _ in range(n):
            age = rng.normal(age_mean, 9)
            bmi = rng.normal(27, 4)
            bp = rng.normal(120 + 0.4 * (age - 50), 12)
            smoker = rng.random() < smoke_rate
            sex = "F" if rng.random() < 0.5 else "M"
            logit = -0.6 + 0.09 * (age - 55) + 0.2 * (bmi - 27) + 0.04 * (bp - 125) + 1.6 * smoker
            readmitted = rng.random() < 1 / (1 + np.exp(-logit))
            rows.append([clinic, f"{age:.0f}", f"{bmi:.1f}", f"{bp:.0f}", "yes" if smoker else "no", sex,
                         "yes" if readmitted else "no"])
    with OUT.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["clinic", "age", "bmi", "systolic_bp", "smoker", "sex", "readmitted"])
        writer.writerows(rows)
    print(f"wrote {OUT} ({len(rows)} rows)")


if __name__ == "__main__":
    main()
