"""Keep the blocks the scripts share identical to airbench94.py's.

The four scripts repeat shared code on purpose (each stands alone). A top-level block (function,
class, constant, import) that two scripts both define must be the same text in both, except the
blocks listed in METHOD_DIFFERENCES: those are where the method differs, and each script's header
lists those changes.

Usage: python tools/shared_blocks.py          report blocks that differ from airbench94.py's
       python tools/shared_blocks.py --sync   rewrite the other scripts as airbench94.py with
                                              their own method blocks put back
"""
import ast
import os
import re
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFERENCE = 'airbench94'
METHOD_DIFFERENCES = {
    'airbench94_compiled': {'__doc__', 'compiled_graph_count', 'compile_net', 'main'},
    'airbench95': {'__doc__', 'hyp'},
    'airbench96': {'__doc__', 'hyp', 'ConvGroup'},
}
SECTION_BANNER = re.compile(r'^#{45}\n#(.+)#\n#{45}$', re.MULTILINE)


def read(name):
    with open(os.path.join(REPO, f'{name}.py')) as f:
        return f.read()


def block_key(node):
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        return node.name
    if isinstance(node, ast.Assign):
        return ','.join(ast.unparse(target) for target in node.targets)
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
        return '__doc__'
    return ast.unparse(node).splitlines()[0]  # imports and the main guard: their first line


def blocks(source):
    """{key: (first line, last line, text)} of the top-level statements, in order."""
    lines = source.splitlines(keepends=True)
    result = {}
    for node in ast.parse(source).body:
        start = node.decorator_list[0].lineno if getattr(node, 'decorator_list', None) else node.lineno
        result[block_key(node)] = (start, node.end_lineno, ''.join(lines[start - 1:node.end_lineno]))
    return result


def sections(source):
    return [title.strip() for title in SECTION_BANNER.findall(source)]


def differences(name):
    """Problems of script `name` against airbench94.py, as readable strings."""
    reference, other = read(REFERENCE), read(name)
    allowed = METHOD_DIFFERENCES.get(name, {'__doc__'})
    problems = []
    if sections(other) != sections(reference):
        problems.append(f'{name}: sections {sections(other)} differ from {sections(reference)}')
    reference_blocks, other_blocks = blocks(reference), blocks(other)
    for key, (_, _, text) in reference_blocks.items():
        if key not in other_blocks:
            problems.append(f'{name}: lacks the shared block {key!r}')
        elif key not in allowed and other_blocks[key][2] != text:
            problems.append(f'{name}: block {key!r} differs from {REFERENCE}.py')
    shared_order = [k for k in other_blocks if k in reference_blocks]
    if shared_order != [k for k in reference_blocks if k in other_blocks]:
        problems.append(f'{name}: shared blocks are in another order than in {REFERENCE}.py')
    return problems


def sync(name):
    """Rewrite script `name` as airbench94.py with that script's own method blocks put back (a
    method block that airbench94.py lacks goes after the shared block it follows)."""
    reference, own_blocks = read(REFERENCE), blocks(read(name))
    reference_blocks = blocks(reference)
    allowed = METHOD_DIFFERENCES.get(name, {'__doc__'})
    extras, anchor = {}, None  # method blocks of this script alone, by the shared block before them
    for key, (_, _, text) in own_blocks.items():
        if key in reference_blocks:
            anchor = key
        elif key in allowed:
            extras.setdefault(anchor, []).append(text)
    lines = reference.splitlines(keepends=True)
    # Replace from the bottom up so that earlier line numbers stay valid
    for key, (start, end, _) in sorted(reference_blocks.items(), key=lambda kv: -kv[1][0]):
        text = own_blocks[key][2] if key in allowed else ''.join(lines[start - 1:end])
        lines[start - 1:end] = [text + ''.join('\n\n' + extra for extra in extras.get(key, []))]
    with open(os.path.join(REPO, f'{name}.py'), 'w') as f:
        f.write(''.join(lines))


def main(argv):
    names = [n for n in METHOD_DIFFERENCES if os.path.exists(os.path.join(REPO, f'{n}.py'))]
    if '--sync' in argv:
        for name in names:
            sync(name)
    problems = [p for name in names for p in differences(name)]
    print('\n'.join(problems) if problems else f'shared blocks identical in {", ".join(names)}')
    return 1 if problems else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
