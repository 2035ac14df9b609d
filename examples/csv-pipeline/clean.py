"""Stage 1: clean the raw sales CSV.

Trims and title-cases the region, drops rows with a missing region or a
units/unit_price that is not a positive number, and adds a revenue column
(units x unit_price). Reads argv[1], writes argv[2].
"""
import csv
import sys

src, dst = sys.argv[1], sys.argv[2]
kept = dropped = 0
with open(src, newline="") as f, open(dst, "w", newline="") as out:
    w = csv.writer(out)
    w.writerow(["date", "region", "product", "units", "unit_price", "revenue"])
    for row in csv.DictReader(f):
        region = (row.get("region") or "").strip().title()
        try:
            units = int(row["units"])
            price = float(row["unit_price"])
        except (KeyError, TypeError, ValueError):
            units = price = 0
        if not region or units <= 0 or price <= 0:
            dropped += 1
            continue
        w.writerow([row["date"].strip(), region, row["product"].strip(), units, f"{price:.2f}", f"{units * price:.2f}"])
        kept += 1
print(f"clean: kept {kept} rows, dropped {dropped}")
