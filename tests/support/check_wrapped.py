#!/usr/bin/env python3
"""check_wrapped.py CTEST BUILD_DIR LAUNCHER — every test of the tree runs
under tests/support/run_in_session.sh (cerb_add_test() in
cmake/CerbTesting.cmake), except harness_leftovers, the check that looks for
what the others left. A test added with a bare add_test() would run without
the per-test session check, and what it starts without the CERB_TEST_RUN
mark that the last check looks for: so it fails here, by name."""

import json
import subprocess
import sys


def main():
    ctest, build, launcher = sys.argv[1:4]
    out = subprocess.run([ctest, "--test-dir", build, "--show-only=json-v1"],
                         check=True, capture_output=True, text=True, timeout=50).stdout
    tests = json.loads(out)["tests"]
    bad = []
    for t in tests:
        cmd = t.get("command") or []
        if t["name"] == "harness_leftovers":
            continue
        # bash, the launcher, the build dir, the test's name, "--", command...
        if len(cmd) < 6 or cmd[1] != launcher or cmd[2] != build or cmd[3] != t["name"] \
                or cmd[4] != "--":
            bad.append(f"{t['name']}: {' '.join(cmd[:3])} ...")
            continue
        props = {p["name"]: p["value"] for p in t.get("properties", [])}
        if "cerb_leftovers" not in (props.get("FIXTURES_REQUIRED") or []):
            bad.append(f"{t['name']}: does not require the fixture cerb_leftovers")
    if bad:
        print("tests not added with cerb_add_test() or not in its fixture "
              "(cmake/CerbTesting.cmake):")
        print("\n".join(bad))
        return 1
    print(f"all {len(tests) - 1} tests run under {launcher}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
