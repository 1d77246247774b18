"""Keep the scripts' shared code identical to airbench94.py's, and measure their layout.

Every script is its method, then one banner ("Running the script: identical in all the airbench
scripts"), then the code that runs it. Below the banner the scripts are byte-identical. Above it, a
top-level block (function, class, assignment) that two scripts both define must be the same text in
both, except the blocks listed in METHOD_DIFFERENCES: there the method differs, and docs/layout.md
lists each script's changes. A block that airbench94.py lacks but several scripts share
(SHARED_BEYOND_REFERENCE) must be the same text in each. Every statement of every script assigns
one name (packed_assignments).

Usage: python tools/shared_blocks.py          report the layout and what differs from airbench94.py
       python tools/shared_blocks.py --sync   rewrite the other scripts with airbench94.py's shared
                                              code and blocks (the others keep their own)
"""
import ast
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFERENCE = 'airbench94'
METHOD_DIFFERENCES = {
    'airbench94_compiled': {'__doc__', 'hyp', 'HYP_CHOICES', 'batch_flip_lr', 'batch_crop',
                            'batch_cutout', 'CifarLoader', 'build_net', 'infer', 'LookaheadState',
                            'synchronized_time', 'train'},
    'airbench95': {'__doc__', 'hyp'},
    'airbench96': {'__doc__', 'hyp', 'ConvGroup'},
    'airbench94_muon': {'__doc__', 'hyp', 'HYP_CHOICES', 'HYP_RANGES', 'batch_flip_lr',
                        'batch_crop', 'batch_cutout', 'CifarLoader', 'make_net', 'reinitialize',
                        'build_net', 'init_whitening', 'LookaheadState', 'lookahead_decay',
                        'infer', 'decoupled_sgd_groups', 'lr_schedule', 'synchronized_time',
                        'train'},
    'airbench96_faster': {'__doc__', 'hyp', 'HYP_CHOICES', 'HYP_RANGES', 'CifarLoader',
                          'ConvGroup', 'make_net', 'build_net', 'train'},
    'airbench94_hiverge': {'__doc__', 'hyp', 'HYP_CHOICES', 'HYP_RANGES', 'batch_flip_lr',
                           'batch_crop', 'batch_cutout', 'CifarLoader', 'ConvGroup', 'make_net',
                           'reinitialize', 'build_net', 'init_whitening', 'LookaheadState',
                           'lookahead_decay', 'infer', 'decoupled_sgd_groups', 'lr_schedule',
                           'synchronized_time', 'train'},
}
# Blocks that airbench94.py lacks, or that several scripts share in place of its own: identical in
# each, as the first has it
SHARED_BEYOND_REFERENCE = {
    'compile_alike_on_every_torch': ['airbench94_compiled', 'airbench94_muon', 'airbench94_hiverge'],
    'compiles': ['airbench94_muon', 'airbench94_hiverge'],
    **dict.fromkeys(['compiled_per_image', 'coin_flips', 'prepared_images', 'DeviceClock',
                     'read_figures', 'with_loss'],
                    ['airbench94_compiled', 'airbench94_muon', 'airbench94_hiverge']),
    **dict.fromkeys(['augmented_images', 'CifarLoader'], ['airbench94_compiled', 'airbench94_muon']),
}
BANNER_PHRASE = 'identical in all the airbench scripts'
LIMITS = {'method': 400, 'tail': 215}  # airbench94.py's, in lines (docs/layout.md); no cap on the
# whole file: the method is read line by line, one statement saying one thing


def read(name):
    with open(os.path.join(REPO, f'{name}.py')) as f:
        return f.read()


def split(source):
    """(docstring lines, method text, tail text): the method runs from the end of the module
    docstring to the banner's first line; the tail from there to the end."""
    lines = source.splitlines(keepends=True)
    banner = next(i for i, line in enumerate(lines) if BANNER_PHRASE in line)
    while banner > 0 and lines[banner - 1].startswith('#'):
        banner -= 1
    doc_end = ast.parse(source).body[0].end_lineno
    return lines[:doc_end], ''.join(lines[doc_end:banner]), ''.join(lines[banner:])


def layout(name):
    """{'method': lines, 'tail': lines} of a script, as the layout check counts them."""
    _, method, tail = split(read(name))
    return {'method': len(method.splitlines()), 'tail': len(tail.splitlines())}


def packed_assignments(path):
    """Lines of a Python file (a script by name: airbench94) that pack names into one statement:
    several targets (a = b = x), a tuple of values unpacked into a tuple of names (a, b = x, y), a
    walrus. A value that comes as a tuple (n, c, h, w = x.shape) is one thing, and not counted.
    The rule of every Python file of the repository, the scripts' first."""
    with open(path if path.endswith('.py') else os.path.join(REPO, f'{path}.py')) as f:
        source = f.read()
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign):
            unpacked = isinstance(node.targets[0], (ast.Tuple, ast.List))
            if len(node.targets) > 1 or (unpacked and isinstance(node.value, (ast.Tuple, ast.List))):
                lines.append(node.lineno)
        elif isinstance(node, ast.NamedExpr):
            lines.append(node.lineno)
    return sorted(lines)


def blocks(text):
    """{key: text} of the top-level statements of a script's method part, in order."""
    lines = text.splitlines(keepends=True)
    result = {}
    for node in ast.parse(text).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            key = node.name
        elif isinstance(node, ast.Assign):
            key = ','.join(ast.unparse(target) for target in node.targets)
        else:
            key = ast.unparse(node).splitlines()[0]
        decorators = getattr(node, 'decorator_list', None)
        start = decorators[0].lineno if decorators else node.lineno
        result[key] = ''.join(lines[start - 1:node.end_lineno])
    return result


def differences(name):
    """Problems of script `name` against airbench94.py, as readable strings."""
    _, reference_method, reference_tail = split(read(REFERENCE))
    _, method, tail = split(read(name))
    problems = [] if tail == reference_tail else [f'{name}: the part below the banner differs from '
                                                  f'{REFERENCE}.py']
    allowed = METHOD_DIFFERENCES.get(name, set())
    reference_blocks = blocks(reference_method)
    own_blocks = blocks(method)
    for key, text in reference_blocks.items():
        if key not in own_blocks and key not in allowed:
            problems.append(f'{name}: lacks the shared block {key!r}')
        elif key not in allowed and own_blocks.get(key) != text:
            problems.append(f'{name}: block {key!r} differs from {REFERENCE}.py')
    for key, names in SHARED_BEYOND_REFERENCE.items():
        if name in names[1:] and own_blocks.get(key) != blocks(split(read(names[0]))[1]).get(key):
            problems.append(f'{name}: block {key!r} differs from {names[0]}.py')
    shared_order = [k for k in own_blocks if k in reference_blocks]
    if shared_order != [k for k in reference_blocks if k in own_blocks]:
        problems.append(f'{name}: shared blocks are in another order than in {REFERENCE}.py')
    return problems


def sync(name):
    """Rewrite script `name` with airbench94.py's part below the banner and airbench94.py's text of
    every method block the two share, except the blocks where the method differs."""
    own_doc, own_method, _ = split(read(name))
    _, method, tail = split(read(REFERENCE))
    allowed = METHOD_DIFFERENCES.get(name, set())
    reference_blocks = blocks(method)
    for key, text in blocks(own_method).items():
        if key in reference_blocks and key not in allowed:
            own_method = own_method.replace(text, reference_blocks[key])
    with open(os.path.join(REPO, f'{name}.py'), 'w') as f:
        f.write(''.join(own_doc) + own_method + tail)


def main(argv):
    names = [n for n in METHOD_DIFFERENCES if os.path.exists(os.path.join(REPO, f'{n}.py'))]
    if '--sync' in argv:
        for name in names:
            sync(name)
    for name in [REFERENCE, *names]:
        print(f'{name}.py: ' + ', '.join(f'{part} {n} lines' for part, n in layout(name).items()))
    problems = [p for name in names for p in differences(name)]
    over = {part: n for part, n in layout(REFERENCE).items() if n > LIMITS[part]}
    problems += [f'{REFERENCE}.py: {part} part over {LIMITS[part]} lines' for part in over]
    problems += [f'{name}.py:{line}: names packed into one statement (one name per assignment)'
                 for name in [REFERENCE, *names] for line in packed_assignments(name)]
    print('\n'.join(problems) if problems else
          f'shared code identical in {REFERENCE}, {", ".join(names)}')
    return 1 if problems else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
