#!/usr/bin/python3
"""check_metrics.py FILE EXPECT... — parse FILE with prometheus_client's own
parser (python3-prometheus-client, the reference implementation of the text
format) and check each EXPECT, written `name{label="v",...}=value` (labels in
any order; `name=value` for a sample without labels; `>` instead of `=` for
"greater than"). Also checks every
histogram: cumulative buckets never decrease, the +Inf bucket equals _count.
Exit 0 when all hold; 1 with one line per mismatch otherwise; 2 when the file
does not parse."""
import re
import sys

from prometheus_client.parser import text_string_to_metric_families


def key(name, labels):
    return (name, tuple(sorted(labels.items())))


def parse_expect(s):
    m = re.fullmatch(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?([=>])(.+)', s)
    if not m:
        raise SystemExit(f"bad expectation {s!r}")
    labels = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"', m.group(2) or ""))
    return key(m.group(1), labels), m.group(3), float(m.group(4))


def main():
    text = open(sys.argv[1]).read()
    samples = {}
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as e:  # the parser raises ValueError and friends
        print(f"does not parse: {e}")
        return 2
    bad = []
    for fam in families:
        buckets = {}
        for s in fam.samples:
            samples[key(s.name, s.labels)] = s.value
            if fam.type == "histogram" and s.name.endswith("_bucket"):
                rest = {k: v for k, v in s.labels.items() if k != "le"}
                buckets.setdefault(tuple(sorted(rest.items())), []).append(
                    (float(s.labels["le"]), s.value))
        for labels, bs in buckets.items():
            vals = [v for _, v in sorted(bs)]
            if vals != sorted(vals):
                bad.append(f"{fam.name}{dict(labels)}: buckets decrease: {vals}")
            count = samples.get((fam.name + "_count", labels))
            if count is None or vals[-1] != count:
                bad.append(f"{fam.name}{dict(labels)}: +Inf {vals[-1]} != _count {count}")
    for e in sys.argv[2:]:
        k, op, want = parse_expect(e)
        got = samples.get(k)
        if got is None or (got != want if op == "=" else not got > want):
            bad.append(f"{e}: got {got}")
    for b in bad:
        print(b)
    print(f"{len(families)} families, {len(samples)} samples, {len(sys.argv) - 2} expectations,"
          f" {len(bad)} mismatches")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
