"""The budget-contract runs as one markdown table (README.md beside it)."""
import json
from pathlib import Path

here = Path(__file__).parent
cols = ["run", "n", "asked", "ratio reached", "n_rounded", "n_errors", "stopped_by", "f1", "accuracy", "evidence_recall"]
print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
for f in sorted(here.glob("*.json"), key=lambda p: (p.stem.split("-")[0], "d9" in p.stem, p.stem)):
    s = json.loads(f.read_text())
    asked = f"ratio {s['ratio_requested']:g}" if s.get("ratio_requested") else f"target_tokens {s.get('target_tokens')}"
    fmt = lambda v: "-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)  # noqa: E731
    stop = " ".join(f"{k} {v}" for k, v in s["stopped_by"].items())
    print("| " + " | ".join([f.stem, str(s["n"]), asked, fmt(s["ratio"]), str(s["n_rounded"]), str(s["n_errors"]), stop,
                             fmt(s["f1"]), fmt(s["accuracy"]), fmt(s["evidence_recall"])]) + " |")
