#!/usr/bin/env python3
# tools/doc_figures.py - regenerates (--update) or checks (--check) the figures in README.md and docs/*.md that come from a run.
"""Figures in the docs that a run produces, kept true by running it again.

A figure is marked in the Markdown by an HTML comment that names the command
making it, and a closing comment:

    <!-- figure: alloyc print examples/ir/char_gpt.ir --train --time-passes 2>&1 >/dev/null -->
    ```
    ...the command's standard output...
    ```
    <!-- /figure -->

The command is run by sh in a scratch directory that looks like the
repository root (every top-level entry linked in, `build` the build
directory), with the build's tools/, examples/ and bench/ first on the PATH,
LC_ALL=C and no ALLOY_* variable set, so `alloyc`, `./build/tools/alloyc`
and `examples/ir/...` work as the docs write them. Two shell functions are
there too: `filesize FILE`, a file's size with thousands separators, and
`bundle_layout FILE`, a bundle's CUDA executable in words (modules, images
and their sizes, the kernel table's bytes, min_driver).

Forms:
  block     the markers on lines of their own around a fenced code block: the
            block's body is the command's output; leading `$ ` lines (and
            their `\\` continuations) stay as written, the command shown.
  inline    both markers on one line: the text between is the command's
            output, one line (a count, a size).
A marker right after a backtick (`<!-- figure: ... -->` in code) is text.
Options, before the colon (shell words):
  transcript    the block's `$ ` lines are the commands: each runs in turn
                (stdout and stderr together) and its output follows it; the
                command after the colon, if any, runs first, unseen.
  file=PATH     the command's output is the file PATH (a picture); the block's
                text stays as written. With varies=, the parts it matches
                (a drawing's coordinates) are left out of the comparison,
                and no stamp is wanted.
  varies=REGEX  what REGEX matches differs run to run (times, rates, sizes of
                build products): --check compares with those parts masked
                and wants the closing marker's "measured" stamp, which
                --update writes (date and machine); --update rewrites such a
                figure only when the rest differs, or with --remeasure.
  slow          skipped by --fast (the meson test).
  needs=A,B     skipped when a program A is not on the PATH (a name) or a
                file is missing (a path with a /).

Exit status: 0 when every checked figure matches (or was updated), 1 when
one differs or its command fails (each named by file, line and command with
the difference), 2 for a usage error or a malformed marker.
"""

import argparse
import datetime
import difflib
import os
import platform
import re
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A marker written as code (`<!-- figure ... -->`, right after a backtick) is text, not a marker.
OPEN = re.compile(r'(?<!`)<!-- figure(?P<head>(?:(?!-->).)*)-->')
CLOSE = re.compile(r'(?<!`)<!-- /figure(?P<stamp>(?:(?!-->).)*)-->')
MASK = '\u2026'

PRELUDE = r'''filesize() { wc -c < "$1" | awk '{ n = $1; s = ""; while (n >= 1000) { s = sprintf(",%03d", n % 1000) s; n = int(n / 1000) } print n s }'; }
bundle_layout() { python3 "$DOC_FIGURES" --bundle-layout "$1"; }
'''


def bundle_layout(path):
    """A bundle's CUDA executable (sections 8 and 9 of docs/bundle.md) in words, one line."""
    with open(path, 'rb') as f:
        data = f.read()
    sections = {}
    offset = 80
    for _ in range(struct.unpack_from('<I', data, 40)[0]):
        tag, _, length = struct.unpack_from('<IIQ', data, offset)
        sections[tag] = data[offset + 16:offset + 16 + length]
        offset += 16 + length
    exe = sections[8]
    min_driver, nmodules, nimages = struct.unpack_from('<iii', exe, 0)
    sizes = {1: [], 2: []}
    p = 12
    for _ in range(nimages):
        kind = struct.unpack_from('<I', exe, p)[0]
        length = struct.unpack_from('<Q', exe, p + 16)[0]
        sizes.setdefault(kind, []).append(length)
        p += 24 + length

    def kb(v):
        return f'{round(min(v) / 1000)}-{round(max(v) / 1000)} KB' if v else 'none'
    return (f'{nmodules} modules, {nimages} images (cubins of {kb(sizes[1])}, PTX of {kb(sizes[2])}), '
            f'a {len(data):,}-byte bundle ({len(sections.get(9, b"")):,} bytes of it the kernel table), '
            f'`min_driver` {min_driver}')


class MarkerError(Exception):
    """A malformed figure marker: file, line and what is wrong."""


class Figure:
    """One marked figure: where it is, its options and command, its current text."""

    def __init__(self, path, text, m_open, m_close):
        self.path = path
        self.line = text.count('\n', 0, m_open.start()) + 1
        head = m_open.group('head')
        if head.startswith(':'):
            head = ' ' + head
        if not head.startswith(' '):
            raise MarkerError(f'{self.where()}: "<!-- figure" must be followed by a space or ":"')
        opts, sep, cmd = head.partition(': ')
        if not sep and opts.rstrip().endswith(':'):
            opts = opts.rstrip()[:-1]
        self.command = cmd.strip()
        self.options = {}
        try:
            words = shlex.split(opts)
        except ValueError as e:
            raise MarkerError(f'{self.where()}: options: {e}') from None
        for w in words:
            key, _, value = w.partition('=')
            if key not in ('transcript', 'file', 'varies', 'slow', 'needs'):
                raise MarkerError(f'{self.where()}: unknown option "{key}" '
                                  '(transcript, file=PATH, varies=REGEX, slow, needs=A,B)')
            self.options[key] = value
        self.varies = None
        if 'varies' in self.options:
            try:
                self.varies = re.compile(self.options['varies'])
            except re.error as e:
                raise MarkerError(f'{self.where()}: varies: {e}') from None
        if not self.command and 'transcript' not in self.options:
            raise MarkerError(f'{self.where()}: no command after "figure:"')
        self.stamp = m_close.group('stamp').strip().lstrip(':').strip()

        line_start = text.rfind('\n', 0, m_open.start()) + 1
        line_end = text.find('\n', m_open.end())
        line_end = len(text) if line_end < 0 else line_end
        close_start = text.rfind('\n', 0, m_close.start()) + 1
        close_end = text.find('\n', m_close.end())
        close_end = len(text) if close_end < 0 else close_end
        own_line = (text[line_start:m_open.start()].strip() == '' and text[m_open.end():line_end].strip() == '')
        close_own = (text[close_start:m_close.start()].strip() == '' and text[m_close.end():close_end].strip() == '')
        self.block = own_line and close_own and close_start > line_end
        if self.block:
            self.span = (line_end + 1, close_start)      # the lines between the markers
        else:
            self.span = (m_open.end(), m_close.start())
            if '\n' in text[self.span[0]:self.span[1]]:
                raise MarkerError(f'{self.where()}: an inline figure must end on its own line '
                                  '(or put both markers on lines of their own)')
            if 'transcript' in self.options or 'file' in self.options:
                raise MarkerError(f'{self.where()}: transcript and file= need a block')
        self.close = (m_close.start(), m_close.end())
        self.content = text[self.span[0]:self.span[1]]

    def where(self):
        return f'{shown_path(self.path)}:{self.line}'

    def name(self):
        c = self.command or 'transcript'
        return c if len(c) <= 90 else c[:87] + '...'


def shown_path(path):
    rel = os.path.relpath(path, ROOT)
    return path if rel.startswith('..') else rel


def find_figures(path):
    """Every figure of a Markdown file, in order; MarkerError when a marker is malformed."""
    with open(path, encoding='utf-8') as f:
        text = f.read()
    figures = []
    pos = 0
    while True:
        m = OPEN.search(text, pos)
        if not m:
            break
        c = CLOSE.search(text, m.end())
        nxt = OPEN.search(text, m.end())
        line = text.count('\n', 0, m.start()) + 1
        if not c or (nxt and nxt.start() < c.start()):
            raise MarkerError(f'{shown_path(path)}:{line}: figure without its "<!-- /figure -->"')
        figures.append(Figure(path, text, m, c))
        pos = c.end()
    stray = CLOSE.search(text, pos)
    if stray:
        line = text.count('\n', 0, stray.start()) + 1
        raise MarkerError(f'{shown_path(path)}:{line}: "<!-- /figure -->" without a figure')
    return text, figures


class Runner:
    """Runs figure commands in scratch copies of the repository root against one build directory."""

    def __init__(self, build):
        self.build = os.path.abspath(build)
        self.cache = {}
        env = {k: v for k, v in os.environ.items() if not k.startswith('ALLOY_')}
        env['LC_ALL'] = 'C'
        env['DOC_FIGURES'] = os.path.abspath(__file__)
        env['PATH'] = os.pathsep.join([os.path.join(self.build, d) for d in ('tools', 'examples', 'bench')]
                                      + [env.get('PATH', '/usr/bin:/bin')])
        self.env = env
        self.scratch = tempfile.mkdtemp(prefix='doc_figures.')

    def close(self):
        shutil.rmtree(self.scratch, ignore_errors=True)

    def workdir(self):
        d = tempfile.mkdtemp(dir=self.scratch)
        for entry in os.listdir(ROOT):
            if entry in ('.git', 'build'):
                continue
            os.symlink(os.path.join(ROOT, entry), os.path.join(d, entry))
        os.symlink(self.build, os.path.join(d, 'build'))
        return d

    def missing(self, needs):
        """The first of needs (programs on the PATH, or paths) that is not there, else None."""
        for n in filter(None, needs.split(',')):
            if '/' in n:
                if not os.path.exists(n if os.path.isabs(n) else os.path.join(ROOT, n)):
                    return n
            elif not shutil.which(n, path=self.env['PATH']):
                return n
        return None

    def sh(self, command, cwd, merge):
        """Runs command; returns (status, output, error text)."""
        try:
            p = subprocess.run(['sh', '-c', PRELUDE + command], cwd=cwd, env=self.env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT if merge else subprocess.PIPE,
                               timeout=600)
        except subprocess.TimeoutExpired:
            return 124, b'', 'timed out after 600 s'
        err = '' if merge else p.stderr.decode('utf-8', 'replace')
        return p.returncode, p.stdout, err

    def output(self, command):
        """stdout of one command (cached per command); raises RuntimeError when it fails."""
        if command not in self.cache:
            status, out, err = self.sh(command, self.workdir(), merge=False)
            if status != 0:
                raise RuntimeError(f'exit status {status}: {err.strip()[-2000:]}')
            self.cache[command] = out
        return self.cache[command]


def split_fence(fig):
    """(opening fence line, body lines, closing fence line) of a block figure's fenced code block."""
    lines = fig.content.split('\n')
    if lines and lines[-1] == '':
        lines.pop()
    if len(lines) < 2 or not lines[0].startswith('```') or lines[-1] != '```':
        raise MarkerError(f'{fig.where()}: a figure block holds one fenced code block (``` ... ```)')
    return lines[0], lines[1:-1], lines[-1]


def shown_commands(body, most=None):
    """The leading `$ ` lines of a body (at most `most` of them), with their backslash continuations."""
    n = count = 0
    while n < len(body) and body[n].startswith('$ ') and (most is None or count < most):
        while body[n].endswith('\\') and n + 1 < len(body):
            n += 1
        n += 1
        count += 1
    return body[:n]


def text_of(out):
    return out.decode('utf-8', 'replace')


def regenerate(fig, runner):
    """The figure's new content (str), or bytes of its file for file=; raises RuntimeError."""
    if 'file' in fig.options:
        return runner.output(fig.command)
    if not fig.block:
        out = text_of(runner.output(fig.command)).strip('\n')
        if '\n' in out:
            raise RuntimeError(f'an inline figure needs one line of output, the command printed {out.count(chr(10)) + 1}')
        return out
    first, body, last = split_fence(fig)
    if 'transcript' in fig.options:
        cwd = runner.workdir()
        if fig.command:
            status, _, err = runner.sh(fig.command, cwd, merge=False)
            if status != 0:
                raise RuntimeError(f'exit status {status}: {err.strip()[-2000:]}')
        new = []
        i = 0
        if not body or not body[0].startswith('$ '):
            raise MarkerError(f'{fig.where()}: a transcript starts with a `$ ` line')
        while i < len(body):
            shown = shown_commands(body[i:], 1)
            i += len(shown)
            while i < len(body) and not body[i].startswith('$ '):
                i += 1
            command = '\n'.join(shown)[2:]
            status, out, _ = runner.sh(command, cwd, merge=True)
            if status != 0:
                raise RuntimeError(f'`{command}`: exit status {status}: {text_of(out).strip()[-2000:]}')
            new += shown + text_of(out).rstrip('\n').split('\n') * (len(out.strip()) > 0)
        return '\n'.join([first] + new + [last]) + '\n'
    shown = shown_commands(body)
    out = text_of(runner.output(fig.command)).rstrip('\n')
    return '\n'.join([first] + shown + ([out] if out else []) + [last]) + '\n'


def masked(fig, s):
    return fig.varies.sub(MASK, s) if fig.varies else s


def graphviz_version(data):
    m = re.search(rb'Generated by graphviz version ([^\n]*?)\s*\n', data)
    return m.group(1).decode() if m else None


def stamp():
    load = os.getloadavg()[0] if hasattr(os, 'getloadavg') else 0.0
    return (f'measured {datetime.date.today().isoformat()} on {platform.machine()}, '
            f'{os.cpu_count()} cores, load average {load:.1f}')


def process(path, runner, args, report):
    """Checks or updates the figures of one file; returns the number of failures."""
    text, figures = find_figures(path)
    failures = 0
    edits = []                     # (start, end, replacement), applied from the end
    for fig in figures:
        if args.only and not any(o in fig.command for o in args.only):
            continue
        if args.fast and 'slow' in fig.options:
            report(f'skipped {fig.where()}: slow ({fig.name()})')
            continue
        gone = runner.missing(fig.options.get('needs', ''))
        if gone:
            report(f'skipped {fig.where()}: needs {gone} ({fig.name()})')
            continue
        try:
            new = regenerate(fig, runner)
        except RuntimeError as e:
            print(f'{fig.where()}: figure "{fig.name()}": the command failed: {e}', file=sys.stderr)
            failures += 1
            continue

        if 'file' in fig.options:
            target = os.path.join(ROOT, fig.options['file'])
            old = open(target, 'rb').read() if os.path.exists(target) else b''
            ov, nv = graphviz_version(old), graphviz_version(new)
            if ov and nv and ov != nv and not args.update:
                report(f'skipped {fig.where()}: {fig.options["file"]} was drawn by Graphviz {ov}, '
                       f'this machine has {nv}')
                continue
            if masked(fig, text_of(old)) == masked(fig, text_of(new)) and not (args.update and args.remeasure):
                continue
            if args.update:
                with open(target, 'wb') as f:
                    f.write(new)
                report(f'updated {fig.options["file"]} ({fig.where()})')
            else:
                show_difference(fig, f'{fig.options["file"]} is not what the command writes',
                                masked_diff(fig, text_of(old), text_of(new), 1), 20)
                failures += 1
            continue

        old = fig.content
        same = masked(fig, old) == masked(fig, new)
        needs_stamp = fig.varies is not None and not fig.stamp.startswith('measured ')
        if same and not needs_stamp and not (args.update and args.remeasure and fig.varies):
            continue
        if args.update:
            edits.append((fig.span[0], fig.span[1], new))
            if fig.varies:
                close = '<!-- /figure: ' + stamp() + ' -->'
                edits.append((fig.close[0], fig.close[1], close))
            elif fig.stamp:
                edits.append((fig.close[0], fig.close[1], '<!-- /figure -->'))
            report(f'updated {fig.where()}: {fig.name()}')
        elif not same:
            show_difference(fig, 'differs from its command\'s output', masked_diff(fig, old, new, fig.line + fig.block))
            failures += 1
        else:
            print(f'{fig.where()}: figure "{fig.name()}" varies from run to run but has no "measured" stamp '
                  'in its closing marker: write it with --update, never by hand', file=sys.stderr)
            failures += 1
    if edits:
        for start, end, rep in sorted(edits, reverse=True):
            text = text[:start] + rep + text[end:]
        with open(path, 'w', encoding='utf-8') as f:
            f.write(text)
    return failures


def masked_diff(fig, old, new, first_line):
    """The lines that differ once the varying parts are masked ('-' the file's, '+' the run's), with one line of context."""
    a, b = old.rstrip('\n').split('\n'), new.rstrip('\n').split('\n')
    matcher = difflib.SequenceMatcher(None, [masked(fig, x) for x in a], [masked(fig, x) for x in b], autojunk=False)
    out = []
    for group in matcher.get_grouped_opcodes(1):
        out.append(f'@@ line {first_line + group[0][1]} @@')
        for tag, i1, i2, j1, j2 in group:
            if tag == 'equal':
                out += [' ' + x for x in a[i1:i2]]
            else:
                out += ['-' + x for x in a[i1:i2]] + ['+' + x for x in b[j1:j2]]
    return out


def show_difference(fig, what, diff, most=60):
    lines = list(diff)
    print(f'{fig.where()}: figure "{fig.name()}" {what}:', file=sys.stderr)
    for line in lines[:most]:
        print('    ' + line[:300], file=sys.stderr)
    if len(lines) > most:
        print(f'    ... {len(lines) - most} more lines', file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description='Regenerate or check the figures of README.md and docs/*.md '
                                 'that come from a run (see the top of this file for the markers).')
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument('--check', action='store_true', help='compare every figure with its command\'s output')
    mode.add_argument('--update', action='store_true', help='rewrite every figure that differs')
    mode.add_argument('--list', action='store_true', help='list the figures and their commands')
    ap.add_argument('--build', default=os.path.join(ROOT, 'build'), help='the build directory (default build/)')
    ap.add_argument('--fast', action='store_true', help='skip the figures marked slow')
    ap.add_argument('--remeasure', action='store_true', help='with --update: rewrite the varying figures too')
    ap.add_argument('--only', action='append', help='only figures whose command contains this text')
    ap.add_argument('-q', '--quiet', action='store_true', help='say nothing but the failures')
    mode.add_argument('--bundle-layout', metavar='FILE', help=argparse.SUPPRESS)
    ap.add_argument('files', nargs='*', help='Markdown files (default README.md and docs/*.md)')
    args = ap.parse_args()
    if args.bundle_layout:
        print(bundle_layout(args.bundle_layout))
        return 0

    files = args.files or [os.path.join(ROOT, 'README.md')] + sorted(
        os.path.join(ROOT, 'docs', f) for f in os.listdir(os.path.join(ROOT, 'docs')) if f.endswith('.md'))
    files = [os.path.abspath(f) for f in files]
    if not os.path.isfile(os.path.join(args.build, 'tools', 'alloyc')):
        print(f'doc_figures: {args.build}: no tools/alloyc in it (build first: meson compile -C {args.build})',
              file=sys.stderr)
        return 2
    report = (lambda s: None) if args.quiet else print
    try:
        for path in files:
            find_figures(path)                # every marker well-formed before anything runs
    except (MarkerError, OSError) as e:
        print(f'doc_figures: {e}', file=sys.stderr)
        return 2
    if args.list:
        for path in files:
            for fig in find_figures(path)[1]:
                opts = ' '.join(sorted(fig.options))
                print(f'{fig.where()}: [{opts}] {fig.command or "(transcript)"}')
        return 0
    runner = Runner(args.build)
    failures = 0
    count = 0
    try:
        for path in files:
            count += len(find_figures(path)[1])
            failures += process(path, runner, args, report)
    except MarkerError as e:
        print(f'doc_figures: {e}', file=sys.stderr)
        return 2
    finally:
        runner.close()
    if failures and args.check:
        print(f'doc_figures: {failures} of {count} figures differ; run `python3 tools/doc_figures.py --update` '
              'and review the diff', file=sys.stderr)
    elif not args.quiet:
        print(f'doc_figures: {count} figures, {failures} failed')
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main())
