#!/usr/bin/env python3
"""The architecture's mechanical rule, checked on src/ (run by scripts/test.sh): no import
cycle between modules. The graph comes from `crate::` and `super::` paths (use lines and inline
paths, comments and `#[cfg(test)] mod tests` left out), at two levels: the top-level modules
(`crate::x`), and sibling files inside each folder. Facts flow one way (the limiter never
imports metrics, the engine never imports the faces), and a cycle is the first sign that they
stopped doing so. (Long code is clippy's `too_many_lines`, on functions: clippy.toml.)

Usage: check-architecture.py [SRC_DIR] [--tests]   (exit 1 on a cycle)
"""
import os, re, sys

args = [a for a in sys.argv[1:] if not a.startswith('--')]
ROOT = args[0] if args else 'src'
with_tests = '--tests' in sys.argv

def modpath(path):
    rel = os.path.relpath(path, ROOT)[:-3].split(os.sep)
    if rel[-1] in ('mod', 'lib', 'main'):
        rel = rel[:-1]
    return rel

def strip_comments(text):
    return re.sub(r'//[^\n]*', '', text)

def strip_tests(text):
    m = re.search(r'#\[cfg\(test\)\]\s*mod tests', text)
    return text[:m.start()] if m else text

def refs(mod, text):
    out = set()
    for m in re.finditer(r'\b(crate|super)((?:::\w+)+)(::\{([^}]*)\})?', text):
        base, rest, _, group = m.groups()
        parts = rest.strip(':').split('::')
        if base == 'crate':
            tgts = [parts]
        else:
            parent = mod[:-1] if mod else []
            tgts = [parent + parts]
        out.update(tuple(t) for t in tgts)
    for m in re.finditer(r'\buse super::\{([^}]*)\}', text):
        parent = mod[:-1]
        for item in m.group(1).split(','):
            item = item.strip().split('::')[0].split(' ')[0]
            if item and item != 'self':
                out.add(tuple(parent + [item]))
    return out

files = {}
for d, _, fs in os.walk(ROOT):
    for f in fs:
        if f.endswith('.rs') and 'bin' not in d.split(os.sep):
            p = os.path.join(d, f)
            files[tuple(modpath(p))] = open(p).read()
mods = set(files)

def resolve(target):
    # the longest prefix that is a module file
    for n in range(len(target), 0, -1):
        if tuple(target[:n]) in mods:
            return tuple(target[:n])
    return None

edges = set()
for mod, text in files.items():
    if mod == ('main',) or mod == ():
        continue
    text = strip_comments(text if with_tests else strip_tests(text))
    for t in refs(list(mod), text):
        r = resolve(list(t))
        if r and r != mod:
            edges.add((mod, r))

def cycles(graph_edges):
    g = {}
    for a, b in graph_edges:
        if a != b:
            g.setdefault(a, set()).add(b)
    # Tarjan SCC
    idx, low, st, on, out, c = {}, {}, [], set(), [], [0]
    def sc(v):
        idx[v] = low[v] = c[0]; c[0] += 1; st.append(v); on.add(v)
        for w in g.get(v, ()):
            if w not in idx: sc(w); low[v] = min(low[v], low[w])
            elif w in on: low[v] = min(low[v], idx[w])
        if low[v] == idx[v]:
            comp = []
            while True:
                w = st.pop(); on.discard(w); comp.append(w)
                if w == v: break
            if len(comp) > 1: out.append(comp)
    for v in list(g):
        if v not in idx: sc(v)
    return out

# level 1: top-level modules (crate::x)
top = {((a[0],), (b[0],)) for a, b in edges if a[0] != b[0]}
# level 2: siblings inside one folder (a and b share a parent, or one is the folder's mod.rs)
sib = set()
for a, b in edges:
    for n in range(1, min(len(a), len(b)) + 1):
        if a[:n] != b[:n]:
            if a[:n-1] == b[:n-1] and n > 1:
                sib.add((a[:n], b[:n]))
            break
bad = False
for name, es in (('top-level modules', top), ('files within a folder', sib)):
    cs = cycles(es)
    print(f'{name}: {len(es)} edges, {len(cs)} cycles')
    for comp in cs:
        bad = True
        print('  cycle:', ' <-> '.join('::'.join(m) for m in comp))
print('top-level edges:')
for a in sorted({a for a, _ in top}):
    print(f'  {a[0]} -> {", ".join(sorted(b[0] for x, b in top if x == a))}')
sys.exit(1 if bad else 0)
