#!/usr/bin/env bash
# check_cli_options.sh CERBERUS CERBERUS_PAGE [BENCH BENCH_PAGE] — the man
# pages keep up with the programs' own usage texts.
#
# cerberus(1): every command `cerberus --help` lists has its `.SS "CMD \(em
# ..."` section under COMMANDS; every option `cerberus help CMD` names
# (a word starting with - or -- after a space, bracket, bar, comma or
# parenthesis) appears in that section, and every exit status its "Exit
# status:" paragraph names appears there too; the global options of
# `cerberus --help` appear under OPTIONS and its exit statuses under EXIT
# STATUS. cerberus-bench(1): every option `cerberus-bench --help` names
# appears in the page, and every scenario the bench knows (the list it
# prints for an unknown one) has its `.TP`/`.B NAME` entry under SCENARIOS.
# The page is read as roff source with \- turned into - and font escapes
# dropped. Each gap is reported with what to add and where; the exit
# status is 1 if there is any.
set -u
cerberus=$1 page=$2 bench=${3:-} bpage=${4:-}
fail=0
nok() { printf 'not ok - %s\n' "$*"; fail=1; }

# The page as text: \- is -, no \fB \fI \fR \fP \% \& escapes.
page_text() { sed -e 's/\\-/-/g' -e 's/\\f[BIRP]//g' -e 's/\\[%&]//g' "$1"; }
# Lines of stdin's section that starts at the line matching $1 (a regex), up
# to the next .SH (or .SS too with $2 = SS).
section() {
    awk -v start="$1" -v ss="${2:-}" '
        found && ($0 ~ /^\.SH/ || (ss && $0 ~ /^\.SS/)) { exit }
        found { print }
        $0 ~ start { found = 1 }'
}
# The options a usage text names, one per line.
options_in() {
    grep -oE '(^|[][ |,(])--?[A-Za-z][A-Za-z0-9-]*' | sed -E 's/^[][ |,(]//' | sort -u
}
# The exit statuses the "Exit status:" paragraph of a usage text names.
statuses_in() {
    sed -n '/^Exit status:/,$p' | grep -oE '\b[0-9]{1,3}\b' | sort -un
}
mentions() { # TEXT WORD: WORD appears, not as part of a longer word
    grep -qE -- "(^|[^A-Za-z0-9-])$2([^A-Za-z0-9-]|$)" <<<"$1"
}

text=$(page_text "$page")
help=$("$cerberus" --help)
mapfile -t commands < <(sed -n '/^Commands:/,/^Options:/p' <<<"$help" | sed -nE 's/^  ([a-z]+).*/\1/p')
((${#commands[@]} > 0)) || nok "no commands found in \`$cerberus --help\`"

# Global options and exit statuses.
opts=$(sed -n '/^Options:/,$p' <<<"$help" | options_in)
optsec=$(section '^\.SH OPTIONS' <<<"$text")
for o in $opts; do
    if mentions "$optsec" "$o"; then echo "ok - global option $o"
    else nok "\`cerberus --help\` names global option $o, which $page does not describe under .SH OPTIONS: add a .TP entry for it"; fi
done
exitsec=$(section '^\.SH "?EXIT STATUS' <<<"$text")
for s in $(statuses_in <<<"$help"); do
    if mentions "$exitsec" "$s"; then echo "ok - exit status $s"
    else nok "\`cerberus --help\` names exit status $s, which $page does not list under .SH EXIT STATUS: add a .TP entry for it"; fi
done

for c in "${commands[@]}"; do
    sec=$(section "^\\.SS \"$c " SS <<<"$text")
    if [[ -z $sec ]]; then
        nok "\`cerberus --help\` lists command '$c', which $page has no section for: add '.SS \"$c \\(em WHAT IT DOES\"' under .SH COMMANDS with its synopsis, options and exit status (see \`cerberus help $c\`)"
        continue
    fi
    echo "ok - command $c has its section"
    [[ $c == help ]] && continue
    usage=$("$cerberus" help "$c")
    # -c and --help belong to every command: the global options above.
    for o in $(options_in <<<"$usage" | grep -vxE -- '-c|-h|--help'); do
        if mentions "$sec" "$o"; then echo "ok - $c $o"
        else nok "\`cerberus help $c\` names option $o, which the section '.SS \"$c ...\"' of $page does not describe: add a .TP entry for $o there"; fi
    done
    for s in $(statuses_in <<<"$usage"); do
        if mentions "$sec" "$s"; then echo "ok - $c exit status $s"
        else nok "\`cerberus help $c\` names exit status $s, which the section '.SS \"$c ...\"' of $page does not: add it to that section's exit status paragraph (and to .SH EXIT STATUS)"; fi
    done
done

if [[ -n $bench ]]; then
    btext=$(page_text "$bpage")
    for o in $("$bench" --help | options_in); do
        if mentions "$btext" "$o"; then echo "ok - cerberus-bench $o"
        else nok "\`cerberus-bench --help\` names option $o, which $bpage does not describe: add a .TP entry for it under .SH OPTIONS"; fi
    done
    known=$("$bench" --scenario '?' 2>&1 | sed -nE 's/.*\(known: ([^)]*)\).*/\1/p')
    [[ -n $known ]] || nok "no scenario list in \`cerberus-bench --scenario '?'\`'s error"
    scen=$(section '^\.SH SCENARIOS' <<<"$btext")
    for s in ${known//,/ }; do
        if [[ $s == all ]]; then
            if mentions "$btext" all; then echo "ok - scenario all"
            else nok "cerberus-bench knows scenario 'all', which $bpage does not mention"; fi
        elif grep -qx "\\.B $s" <<<"$scen"; then echo "ok - scenario $s"
        else nok "cerberus-bench knows scenario '$s', which $bpage does not describe: add '.TP' and '.B $s' with what it measures under .SH SCENARIOS (and name it under --scenario)"; fi
    done
fi
exit "$fail"
