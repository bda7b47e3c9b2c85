"""The global-memory instructions of each kernel in an Nsight Compute source page (`ncu --import R --page source --csv
--print-source sass`, .csv or .csv.gz, one table per profiled kernel): each load / store / copy instruction that ran,
its execution count and the table's sector and request columns, so two kernels' ways of reading the same bytes
(e.g. attngen's decode and cuDNN's) compare line by line. Usage: python scripts/ncu_loads.py FILE"""
import csv
import gzip
import io
import sys

MEMORY = ("LDG", "STG", "LDGSTS", "UTMALDG", "UBLKCP", "LDGDEPBAR", "ATOM", "RED")

path = sys.argv[1]
raw = gzip.open(path, "rt") if path.endswith(".gz") else open(path)
tables, cur = [], None
for row in csv.reader(io.StringIO(raw.read())):
    if "Address" in row and "Source" in row:
        cur = {"header": row, "rows": [], "title": tables[-1]["next_title"] if tables else ""}
        tables.append(cur)
        cur["next_title"] = ""
    elif cur is not None and len(row) == len(cur["header"]):
        cur["rows"].append(row)
    elif row:
        if cur is not None:
            cur["next_title"] = " ".join(row)[:120]
        else:
            tables.append({"header": [], "rows": [], "next_title": " ".join(row)[:120]})
for t in tables:
    if not t["header"]:
        continue
    h = t["header"]
    src, ex = h.index("Source"), h.index("Instructions Executed") if "Instructions Executed" in h else None
    cols = [k for k, name in enumerate(h) if any(w in name for w in ("Sector", "Excessive", "Request", "L2"))]
    print(f"== {t['title']}\n   columns: {[h[k] for k in cols]}")
    for r in t["rows"]:
        op = r[src].strip().split(" ")
        op = next((w for w in op if w and not w.startswith("@")), "")
        if op.split(".")[0] in MEMORY and (ex is None or float(r[ex] or 0) > 0):
            print(f"   {r[src].strip()[:70]:70s} exec {r[ex] if ex is not None else '?':>9} "
                  + " ".join(f"{r[k] or 0}" for k in cols))
