"""Stage 3: summarize the filtered sales per region, as JSON.

Reads argv[1] (the filtered CSV), writes argv[2] and prints a small table.
"""
import csv
import json
import sys

by_region = {}
rows = 0
total = 0.0
smallest = None
with open(sys.argv[1], newline="") as f:
    for row in csv.DictReader(f):
        rev = float(row["revenue"])
        r = by_region.setdefault(row["region"], {"sales": 0, "revenue": 0.0})
        r["sales"] += 1
        r["revenue"] = round(r["revenue"] + rev, 2)
        rows += 1
        total += rev
        smallest = rev if smallest is None else min(smallest, rev)
summary = {
    "sales": rows,
    "revenue": round(total, 2),
    "smallest": smallest,
    "by_region": dict(sorted(by_region.items())),
}
with open(sys.argv[2], "w") as out:
    json.dump(summary, out, indent=2)
for name, r in summary["by_region"].items():
    print(f"{name:<8} {r['sales']:>3} sales {r['revenue']:>10.2f}")
print(f"{'total':<8} {rows:>3} sales {total:>10.2f}")
