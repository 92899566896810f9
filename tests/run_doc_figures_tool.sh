#!/bin/sh
# tests/run_doc_figures_tool.sh - tools/doc_figures.py on hand-written Markdown: stale figures found and named, rewritten by --update, times masked, bad markers refused.
#
# Usage: run_doc_figures_tool.sh PYTHON TOOL BUILD_DIR
set -u
python=$1 tool=$2 build=$3
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
fail() { printf 'FAIL: %s\n' "$*"; exit 1; }
run() { "$python" "$tool" --build "$build" "$@" >"$tmp/out" 2>&1; }

# A block, an inline count, a transcript and a time, each stale.
cat >"$tmp/doc.md" <<'EOF'
# A page

<!-- figure: printf 'a\nb\n' -->
```
a
stale
```
<!-- /figure -->

Three is <!-- figure: echo 1 2 3 | wc -w -->4<!-- /figure --> words.

<!-- figure transcript -->
```
$ echo one
two
$ echo three \
    four
old
```
<!-- /figure -->

<!-- figure varies='[0-9]+ ms': echo took 12 ms -->
```
took 34 ms
```
<!-- /figure -->

Written as code, `<!-- figure: false -->` is text.
EOF
cp "$tmp/doc.md" "$tmp/orig.md"

run --check "$tmp/doc.md" && fail "--check passed stale figures: $(cat "$tmp/out")"
grep -q "doc.md:3: figure \"printf 'a\\\\nb\\\\n'\" differs" "$tmp/out" || fail "the block's difference is not named: $(cat "$tmp/out")"
grep -q '^    -stale$' "$tmp/out" && grep -q '^    +b$' "$tmp/out" || fail "the block's lines are not shown: $(cat "$tmp/out")"
grep -q 'doc.md:10: figure "echo 1 2 3 | wc -w" differs' "$tmp/out" || fail "the inline count is not named: $(cat "$tmp/out")"
grep -q 'doc.md:12: figure "transcript" differs' "$tmp/out" || fail "the transcript is not named: $(cat "$tmp/out")"
grep -q 'doc.md:22: .*no "measured" stamp' "$tmp/out" || fail "a time without its stamp passed: $(cat "$tmp/out")"
grep -q 'doc.md:22: .*differs' "$tmp/out" && fail "a time that differs only in its number was reported: $(cat "$tmp/out")"
grep -q '4 of 4 figures differ' "$tmp/out" || fail "the count of stale figures: $(cat "$tmp/out")"
cmp -s "$tmp/doc.md" "$tmp/orig.md" || fail "--check changed the file"

run --update "$tmp/doc.md" || fail "--update failed: $(cat "$tmp/out")"
cat >"$tmp/want.md" <<'EOF'
# A page

<!-- figure: printf 'a\nb\n' -->
```
a
b
```
<!-- /figure -->

Three is <!-- figure: echo 1 2 3 | wc -w -->3<!-- /figure --> words.

<!-- figure transcript -->
```
$ echo one
one
$ echo three \
    four
three four
```
<!-- /figure -->

<!-- figure varies='[0-9]+ ms': echo took 12 ms -->
```
took 12 ms
```
EOF
head -n 25 "$tmp/doc.md" | cmp -s - "$tmp/want.md" || { diff "$tmp/want.md" "$tmp/doc.md"; fail "--update wrote other text"; }
sed -n 26p "$tmp/doc.md" | grep -Eq '^<!-- /figure: measured [0-9]{4}-[0-9]{2}-[0-9]{2} on .*, [0-9]+ cores, load average [0-9.]+ -->$' ||
    fail "the time's stamp: $(sed -n 26p "$tmp/doc.md")"
run --check "$tmp/doc.md" || fail "--check after --update: $(cat "$tmp/out")"

# Another time is masked; a count written by hand in its stamped block is not.
sed -i 's/^took 12 ms$/took 99 ms/' "$tmp/doc.md"
run --check "$tmp/doc.md" || fail "a time alone made --check fail: $(cat "$tmp/out")"
sed -i 's/^took 99 ms$/took 99 ms!/' "$tmp/doc.md"
run --check "$tmp/doc.md" && fail "a changed word beside a time passed"

# A file figure: the file is what the command writes.
mkdir -p "$tmp/img"
printf 'old\n' >"$tmp/img/f.txt"
printf '<!-- figure file=%s: echo new -->\n[f](img/f.txt)\n<!-- /figure -->\n' "$tmp/img/f.txt" >"$tmp/file.md"
run --check "$tmp/file.md" && fail "a stale file passed"
grep -q 'f.txt is not what the command writes' "$tmp/out" || fail "the file is not named: $(cat "$tmp/out")"
run --update "$tmp/file.md" && [ "$(cat "$tmp/img/f.txt")" = new ] || fail "--update did not write the file"

# Skips: slow under --fast, a missing program; a failing command is a failure naming it.
printf '<!-- figure slow: echo 2 -->1<!-- /figure -->\n<!-- figure needs=no-such-program: echo 2 -->1<!-- /figure -->\n' >"$tmp/skip.md"
run --check --fast "$tmp/skip.md" || fail "skipped figures failed: $(cat "$tmp/out")"
grep -q 'skipped .*skip.md:1: slow' "$tmp/out" && grep -q 'skipped .*skip.md:2: needs no-such-program' "$tmp/out" ||
    fail "the skips are not said: $(cat "$tmp/out")"
printf '<!-- figure: echo oops >&2; exit 3 -->1<!-- /figure -->\n' >"$tmp/bad.md"
run --check "$tmp/bad.md" && fail "a failing command passed"
grep -q 'bad.md:1: .*the command failed: exit status 3: oops' "$tmp/out" || fail "the failure is not named: $(cat "$tmp/out")"

# Malformed markers: exit status 2, naming file and line, before anything runs.
for bad in '<!-- figure: echo 1 -->1' '<!-- figure frobnicate: echo 1 -->1<!-- /figure -->' \
           'x <!-- /figure -->' '<!-- figure varies=(: echo 1 -->1<!-- /figure -->'; do
    printf 'text\n%s\n' "$bad" >"$tmp/malformed.md"
    run --check "$tmp/malformed.md"
    [ $? -eq 2 ] || fail "malformed marker '$bad' gave status $?: $(cat "$tmp/out")"
    grep -q 'malformed.md:2: ' "$tmp/out" || fail "malformed marker '$bad' not placed: $(cat "$tmp/out")"
done
echo "doc_figures tool: stale blocks, counts, transcripts and files found and rewritten; times masked and stamped; skips and bad markers named"
