#!/usr/bin/env bash
# test_bench_report.sh — the renderer of docs/performance.md
# (scripts/bench-report.sh --from-json, scripts/bench_report.py), with no
# server and no run: the committed sample (bench_report_sample.json, a short
# real run of the three engines with the peers, cut to the 1-thread rows,
# and its metadata bench_report_sample.json.meta.json) still follows
# cerberus-bench's JSON schema (check_bench_json.py), so a change of the
# bench's output shows here; rendered, the page has a table per engine with
# the rows the sample has, the machine, the date, the commit and the exact
# command of the metadata, the plot, the missed targets and the fixed text,
# and no ```console block; without metadata it still renders and says so;
# bad command lines exit 2. Then the committed docs/performance.md: the
# renderer's shape, and the plot it embeds is committed beside it.
#
# Usage: test_bench_report.sh SOURCE-DIR
# Environment: CERB_PYTHON (default /usr/bin/python3).
#
# Output is TAP-like: one "ok"/"not ok" line per check; the exit status is
# 1 if any failed.

set -u

SRC=${1:?usage: test_bench_report.sh SOURCE-DIR}
SRC=$(cd "$SRC" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/bench/tap.sh
. "$HERE/tap.sh" cerb-bench-report-test

SAMPLE=$HERE/bench_report_sample.json

# 1. The sample is cerberus-bench's JSON as it is today.
check "the sample follows cerberus-bench's JSON schema, with peer rows" \
    "$PY" "$HERE/check_bench_json.py" "$SAMPLE" --peer-rows some --peer-status measured

# 2. Rendered through the script, as a user re-renders.
cp "$SAMPLE" "$WORK/bench.json"
cp "$SAMPLE.meta.json" "$WORK/bench.json.meta.json"
mkdir "$WORK/out"
if CERB_PYTHON=$PY bash "$SRC/scripts/bench-report.sh" --from-json "$WORK/bench.json" \
        --out "$WORK/out" >"$WORK/render.txt" 2>&1 && [ -s "$WORK/out/performance.md" ]; then
    ok "bench-report.sh --from-json renders the page"
else
    not_ok "bench-report.sh --from-json renders the page"
    sed 's/^/# /' "$WORK/render.txt"
fi
check "--from-json runs nothing: no servers, no build, a \"==> \" line" \
    grep -q '^==> .*render' "$WORK/render.txt"

# 3. What the page must say, checked against the sample itself.
if "$PY" - "$WORK/out/performance.md" "$WORK/bench.json" "$WORK/bench.json.meta.json" <<'PYEOF'
import json, re, sys

page_path, rows_path, meta_path = sys.argv[1:4]
page = open(page_path).read()
rows = json.load(open(rows_path))
meta = json.load(open(meta_path))
lines = page.splitlines()
errors = []
titles = {"redis": "Redis", "zk": "ZooKeeper", "etcd": "etcd"}

if not lines or lines[0] != "# Performance":
    errors.append("the first line is not '# Performance'")

def section(title):
    """The lines under '## title' up to the next '## '."""
    try:
        i = lines.index("## " + title)
    except ValueError:
        return None
    out = []
    for l in lines[i + 1:]:
        if l.startswith("## "):
            break
        out.append(l)
    return out

engines = []
for r in rows:
    if r["engine"] not in engines:
        engines.append(r["engine"])
for e in engines:
    sec = section(titles[e])
    if sec is None:
        errors.append("no section '## %s'" % titles[e])
        continue
    table = [l for l in sec if l.startswith("|")]
    if not table or not table[0].startswith("| Scenario | Cerberus | Raw ceiling | Ratio |"):
        errors.append("%s: no table with Scenario, Cerberus, Raw ceiling, Ratio" % e)
        continue
    width = table[0].count("|")
    for l in table:
        if l.replace("\\|", "").count("|") != width:
            errors.append("%s: a table row with another number of cells: %s" % (e, l))
    body = "\n".join(table[2:])
    own = [r for r in rows if r["engine"] == e and r["peer"] is None]
    for r in own:
        want = {"uncontended": "uncontended, %d thread" % r["threads"],
                "handoff": "handoff, %d waiters" % r["threads"],
                "herd": "herd, %d waiters" % r["threads"],
                "many": "many, ",
                "guard": "guard begin + finish, %d thread" % r["threads"],
                "guard-dup": "guard duplicate, %d thread" % r["threads"],
                "switch": "after `cerberus switch %s`" % e}[r["scenario"]]
        if want not in body:
            errors.append("%s: no row for %s (%r)" % (e, r["scenario"], want))
    unc = [r for r in own if r["scenario"] == "uncontended"][0]
    if "%.2f" % unc["ratio"] not in body:
        errors.append("%s: the uncontended ratio %.2f is not in the table" % (e, unc["ratio"]))
    for p in [r for r in rows if r["engine"] == e and r["peer"] is not None]:
        name = {"redis-py": "redis-py", "curator": "Curator", "kazoo": "kazoo",
                "python-etcd3": "python-etcd3", "etcdctl": "etcdctl"}.get(p["peer"], p["peer"])
        if name not in body:
            errors.append("%s: peer %s is not in the table" % (e, name))

run = section("This run") or []
run_text = "\n".join(run)
m = meta["machine"]
machine = [l for l in run if l.startswith("- **Machine:**")]
if not machine or m["cpu"] not in machine[0] or "%d cores" % m["cores"] not in machine[0] \
        or m["kernel"] not in machine[0] or m["os"] not in machine[0]:
    errors.append("no machine line with the CPU, cores, kernel and OS: %r" % machine)
servers = [l for l in run if l.startswith("- **Servers:**")]
for k in ("redis", "zk", "etcd"):
    v = meta["servers"][k]["version"]
    if not servers or v not in servers[0]:
        errors.append("the servers line does not give %s %s" % (k, v))
d = meta["date_utc"]  # 2026-11-29T07:58:31Z, shown as 2026-11-29 07:58 UTC
shown = "%s %s UTC" % (d[:10], d[11:16])
if not any(l.startswith("- **Date:**") and shown in l for l in run):
    errors.append("no date line with %s" % shown)
if not any(l.startswith("- **Commit:**") and meta["commit"][:12] in l for l in run):
    errors.append("no commit line with %s" % meta["commit"][:12])
if "```sh\n%s\n```" % meta["command"] not in run_text:
    errors.append("the command is not shown, whole, in a ```sh block")
if meta.get("config_text") and meta["config_text"].strip() not in run_text:
    errors.append("the -c file's text is not shown")

if "![" not in page or "](performance.png)" not in page:
    errors.append("the plot performance.png is not embedded")
for title in ("Summary", "The plot", "Targets this run missed", "What each scenario measures",
              "Rerunning it"):
    if section(title) is None:
        errors.append("no section '## %s'" % title)
for sub in ("### The raw ceiling", "### The scenarios", "### Known gaps"):
    if sub not in lines:
        errors.append("no %s" % sub)
if re.search(r"^```console", page, re.M):
    errors.append("a ```console block (the page shows commands only, in ```sh)")
if "<!-- generated by scripts/bench-report.sh" not in page:
    errors.append("no 'generated by' marker")
for e in errors:
    print("# " + e)
sys.exit(1 if errors else 0)
PYEOF
then
    ok "the page: a table per engine, the machine, date, commit and command, the plot, the fixed text"
else
    not_ok "the page: a table per engine, the machine, date, commit and command, the plot, the fixed text"
fi

# 4. Without metadata: still a page, saying what is unknown.
rm "$WORK/bench.json.meta.json"
if "$PY" "$SRC/scripts/bench_report.py" render --json "$WORK/bench.json" \
        --meta "$WORK/bench.json.meta.json" --out "$WORK/bare.md" >"$WORK/bare.txt" 2>&1 &&
    grep -q '^- \*\*Date:\*\* unknown' "$WORK/bare.md" && grep -q '^## Redis' "$WORK/bare.md"; then
    ok "without metadata the page still renders, the date unknown"
else
    not_ok "without metadata the page still renders, the date unknown"
    sed 's/^/# /' "$WORK/bare.txt"
fi

# 5. Bad command lines exit 2, before anything runs.
bash "$SRC/scripts/bench-report.sh" --from-json "$WORK/nosuch.json" --out "$WORK/out" >/dev/null 2>&1
check "--from-json with no such file exits 2" test $? = 2
bash "$SRC/scripts/bench-report.sh" --duration soon >/dev/null 2>&1
check "--duration soon exits 2" test $? = 2
bash "$SRC/scripts/bench-report.sh" --nosuch >/dev/null 2>&1
check "an unknown option exits 2" test $? = 2
bash "$SRC/scripts/bench-report.sh" --json-only --from-json "$SAMPLE" >/dev/null 2>&1
check "--json-only with --from-json exits 2" test $? = 2

# 6. The committed page: the renderer's, with its plot beside it.
PAGE=$SRC/docs/performance.md
if [ -f "$PAGE" ]; then
    # shellcheck disable=SC2016 # $1 is the inner shell's
    check "docs/performance.md is generated (its marker) and says machine, date and command" \
        bash -c 'grep -q "^<!-- generated by scripts/bench-report.sh" "$1" &&
                 grep -q "^- \*\*Machine:\*\* " "$1" && grep -q "^- \*\*Date:\*\* [0-9]" "$1" &&
                 grep -q "^build/bench/cerberus-bench " "$1" &&
                 grep -q "^## Redis$" "$1" && grep -q "^## ZooKeeper$" "$1" &&
                 grep -q "^## etcd$" "$1"' _ "$PAGE"
    check "docs/performance.png is committed beside it, a PNG" \
        test "$(head -c 8 "$SRC/docs/performance.png" 2>/dev/null | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a
else
    not_ok "docs/performance.md exists (run scripts/bench-report.sh)"
fi

echo "1..$N"
exit $FAILED
