"""Every private name of TensorFlow, Keras and Sonnet in replicator's source has a record.

The scan reads each file of `replicator/` (its syntax tree) and finds:
- imports of a private module (`tensorflow.python...`, `tensorflow.core...`,
  `keras.src...`, `sonnet.src...`) and the names used from it;
- `tf.__internal__...`, TensorFlow's API for its own libraries;
- `x._name` (one leading underscore), and `getattr`/`setattr`/`hasattr`/
  `delattr` of a literal `"_name"`;
- a match of words against an error's text (`"..." in str(error)`,
  `PATTERN.search(str(error))`, `X in error.message`).
Each must be covered by a record: a `private_names.Use` or a
`registry.Patch` (its name or an attribute it reads) for a name, an
`error_texts.MESSAGES` record whose text is the one matched for words.
Words compared otherwise (`str.startswith`, a variable's name) are not found:
their records are written by hand.

Replicator's own private names are many, and an attribute is known here by
its name only (the scan does not know the type of `x` in `x._name`). A name
is replicator's own where replicator defines it (`def _x`, `class _X`, a
class attribute, `self._x = ...`, a module or local variable, an import `as
_x`) and TensorFlow does not: a name that a class of replicator defines or
sets but a TensorFlow, Keras or Sonnet class it inherits from has too (in its
`__dict__` or as `self._x` in its source), or that a class of replicator
defines and replicator never reads (it is there for TensorFlow to call), is
TensorFlow's. Attributes that replicator sets on others' objects are named
`_replicator_...`, which marks them as its own. A name that is both
replicator's own and a recorded one is listed in `BOTH` with the reason: its
uses all count as covered, so a new use of TensorFlow's under that name would
go unseen; the list keeps those names few and explained.
"""

import ast
import importlib
import inspect
import pathlib
import re

from replicator.patches import error_texts
from replicator.patches import private_names
from replicator.patches import registry

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "replicator"
_PRIVATE_MODULE = re.compile(r"^(tensorflow\.(python|core|_api)|keras\.src|sonnet\.src|tf_keras)\b")
_ATTRIBUTE_BUILTINS = ("getattr", "setattr", "hasattr", "delattr")
_SEARCHES = ("search", "match", "fullmatch", "findall", "finditer")

# Names that replicator defines and that records cover as TensorFlow's too
# (a name of TensorFlow's variables or functions that replicator also reads on
# them, where the scan cannot tell them from replicator's objects), and why.
BOTH = {
    "_jit_compile": "InGraphEngine's own flag; tf.function's is read by "
                    "patches.nested_functions (a Patch's reads).",
    "_dense_var_to_tensor": "ReplicatedVariable defines it, as TensorFlow's variables "
                            "do, and calls its copy's.",
    "_strided_slice_assign": "Both engines' variables define it (TensorFlow calls it "
                             "for `var[...].assign`) and call their copy's or base's.",
    "_unique_id": "ReplicatedVariable's answers with its first copy's.",
    "_in_graph_mode": "ReplicatedVariable's answers with its first copy's.",
    "_use_packed_variable": "The strategy engine's variables override "
                            "DistributedVariable's and call it.",
}


def _is_private(name: str) -> bool:
  return name.startswith("_") and not name.startswith("__")


def _module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(ROOT).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources():
  return {_module_name(path): path.read_text() for path in sorted(PACKAGE.rglob("*.py"))}


def _chain(node):
  """`a.b.c` of a Name with Attributes on it, as ["a", "b", "c"]; else None."""
  parts = []
  while isinstance(node, ast.Attribute):
    parts.append(node.attr)
    node = node.value
  if not isinstance(node, ast.Name):
    return None
  return [node.id] + parts[::-1]


def _literal_attribute(node):
  """The name of `getattr(x, "_name", ...)` and its kin, or None."""
  if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
      and node.func.id in _ATTRIBUTE_BUILTINS and len(node.args) >= 2
      and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
    return node.args[1].value
  return None


class _Scan(ast.NodeVisitor):
  """What one module defines, reads and uses (see the module's docstring)."""

  def __init__(self, module: str):
    self.module = module
    self.aliases = {}  # local name -> private module
    self.modules = set()  # private modules imported
    self.from_modules = set()  # (private module, name used from it)
    self.internal = set()  # "__internal__...." chains
    self.attributes = {}  # private attribute name -> a line that uses it
    self.defined = set()  # private names that replicator defines here
    self.read = set()  # names read (attributes and plain names)
    self.classes = {}  # class name -> private names it defines or uses on self
    self.matches = []  # (line, the expression whose words are matched)
    self._class = []
    self._texts = set()  # local names bound to an error's text

  def visit_Import(self, node):
    for alias in node.names:
      if _PRIVATE_MODULE.match(alias.name):
        self.modules.add(alias.name)
        self.aliases[alias.asname or alias.name] = alias.name

  def visit_ImportFrom(self, node):
    for alias in node.names:
      if node.module and _PRIVATE_MODULE.match(node.module):
        self.modules.add(f"{node.module}.{alias.name}")
        self.aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
      if alias.asname and _is_private(alias.asname):
        self.defined.add(alias.asname)

  def visit_ClassDef(self, node):
    self._define(node.name)
    names = self.classes.setdefault(node.name, set())
    for statement in node.body:
      targets = ([statement] if isinstance(statement, (ast.FunctionDef, ast.ClassDef))
                 else getattr(statement, "targets", [getattr(statement, "target", None)]))
      for target in targets:
        name = getattr(target, "name", None) or getattr(target, "id", None)
        if name and _is_private(name):
          names.add(name)
    self._class.append(names)
    self.generic_visit(node)
    self._class.pop()

  def visit_FunctionDef(self, node):
    self._define(node.name)
    for arg in node.args.args + node.args.kwonlyargs:
      self._define(arg.arg)
    texts, self._texts = self._texts, set()
    self.generic_visit(node)
    self._texts = texts

  visit_AsyncFunctionDef = visit_FunctionDef

  def visit_Name(self, node):
    if isinstance(node.ctx, ast.Store):
      self._define(node.id)
    else:
      self.read.add(node.id)

  def visit_Assign(self, node):
    if self._is_text(node.value):
      self._texts.update(t.id for t in node.targets if isinstance(t, ast.Name))
    self.generic_visit(node)

  def visit_Attribute(self, node):
    chain = _chain(node)
    if chain and chain[0] in self.aliases and len(chain) > 1:
      self.from_modules.add((self.aliases[chain[0]], chain[1]))
    elif chain and chain[:2] == ["tf", "__internal__"]:
      self.internal.add(".".join(chain[1:]))
    if _is_private(node.attr):
      self._use(node.attr, node, on_self=isinstance(node.value, ast.Name)
                and node.value.id in ("self", "cls"), store=isinstance(node.ctx, ast.Store))
    if not isinstance(node.ctx, ast.Store):
      self.read.add(node.attr)
    self.generic_visit(node)

  def visit_Call(self, node):
    name = _literal_attribute(node)
    if name is not None:
      self.read.add(name)
      if _is_private(name):
        self._use(name, node, on_self=False, store=False)
    if (isinstance(node.func, ast.Attribute) and node.func.attr in _SEARCHES
        and node.args and self._is_text(node.args[0])):
      self.matches.append((node.lineno, node.func.value))
    self.generic_visit(node)

  def visit_Compare(self, node):
    if (len(node.ops) == 1 and isinstance(node.ops[0], (ast.In, ast.NotIn))
        and self._is_text(node.comparators[0])):
      self.matches.append((node.lineno, node.left))
    self.generic_visit(node)

  def _is_text(self, node) -> bool:
    """Whether `node` is an error's text: `str(e)`, `e.message`, either `or ""`."""
    if isinstance(node, ast.BoolOp):
      return any(self._is_text(value) for value in node.values)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
      return node.func.id == "str" and len(node.args) == 1 and isinstance(
          node.args[0], ast.Name)
    if isinstance(node, ast.Attribute):
      return node.attr == "message"
    return isinstance(node, ast.Name) and node.id in self._texts

  def _define(self, name):
    if _is_private(name):
      self.defined.add(name)

  def _use(self, name, node, on_self: bool, store: bool):
    if on_self and self._class:
      self._class[-1].add(name)
      if store:
        self.defined.add(name)
        return
    self.attributes.setdefault(name, f"{self.module}:{node.lineno}")


def scan(sources):
  """`{module: _Scan}` of `{module: source}`."""
  scans = {}
  for module, source in sources.items():
    scans[module] = _Scan(module)
    scans[module].visit(ast.parse(source))
  return scans


def _records():
  return private_names.USES + error_texts.MESSAGES


def _covered_names() -> set:
  names = set()
  for use in _records():
    if use.name:
      names.add(use.name.split(".")[-1])
  for patch in registry.PATCHES:
    names.add(patch.name.split(".")[-1])
    names.update(patch.reads)
  return names


def _source_of(cls) -> str:
  try:
    return inspect.getsource(cls)
  except (OSError, TypeError):  # a class of C++ (pybind), or a builtin
    return ""


def _tensorflows(scans) -> dict:
  """{name: why it is TensorFlow's} of the private names replicator defines."""
  read = set().union(*(s.read for s in scans.values()))
  found = {}
  for module, found_in in scans.items():
    try:
      namespace = importlib.import_module(module)
    except ImportError:  # (a module of the scan's own test)
      namespace = None
    for class_name, names in found_in.classes.items():
      for name in sorted(names - read):
        found[name] = f"{module}.{class_name} defines it and replicator never reads it"
      cls = getattr(namespace, class_name, None)
      if not inspect.isclass(cls):
        continue
      for base in cls.__mro__[1:]:
        if base.__module__.startswith("replicator") or base is object:
          continue
        source = _source_of(base)
        for name in sorted(names):
          if name in vars(base) or re.search(rf"\bself\.{name}\b", source):
            found.setdefault(name, f"{module}.{class_name} inherits it from "
                             f"{base.__module__}.{base.__qualname__}")
  return found


def _namespace(module: str, source: str) -> dict:
  try:
    return vars(importlib.import_module(module))
  except ImportError:  # (a module of the scan's own test)
    namespace = {}
    exec(compile(source, module, "exec"), namespace)  # pylint: disable=exec-used
    return namespace


def _matched_value(module: str, source: str, expression):
  """The words (a str) or pattern that `expression`, in `module`, matches."""
  if isinstance(expression, ast.Constant):
    return expression.value
  value = eval(compile(ast.Expression(expression), module, "eval"),  # pylint: disable=eval-used
               _namespace(module, source))
  return getattr(value, "pattern", value)


def problems(sources) -> list:
  """What in `sources` (`{module: source}`) no record covers, one line each."""
  scans = scan(sources)
  records = _records()
  modules = {use.module for use in records} | {patch.module for patch in registry.PATCHES}
  in_modules = ({(use.module, use.name.split(".")[0]) for use in records}
                | {(patch.module, patch.name.split(".")[0]) for patch in registry.PATCHES})
  covered = _covered_names()
  tensorflows = _tensorflows(scans)
  own = set().union(*(s.defined for s in scans.values())) - set(tensorflows)
  found = []
  for module, found_in in scans.items():
    for imported in sorted(found_in.modules - modules):
      found.append(f"{module} imports the private module {imported}")
    for pair in sorted(found_in.from_modules - in_modules):
      found.append(f"{module} uses {'.'.join(pair)}")
    for chain in sorted(found_in.internal):
      longer = any(other.startswith(chain + ".") for other in found_in.internal)
      if not longer and ("tensorflow", chain) not in {(u.module, u.name) for u in records}:
        found.append(f"{module} uses tf.{chain}")
    for name, where in sorted(found_in.attributes.items()):
      if name not in own and name not in covered and not name.startswith("_replicator_"):
        found.append(f"{where} uses the attribute {name}")
    for line, expression in found_in.matches:
      words = _matched_value(module, sources[module], expression)
      if not any(use.text == words and module in use.used_in for use in error_texts.MESSAGES):
        found.append(f"{module}:{line} matches {words!r} against an error's text")
  for name, why in sorted(tensorflows.items()):
    if name not in covered:
      found.append(f"{name}: {why}")
  both = sorted((own & covered) - set(BOTH))
  if both:
    found.append(f"replicator defines {both}, which records cover as TensorFlow's "
                 "names too: add each to BOTH with the reason")
  return found


def test_every_private_name_that_replicator_uses_has_a_record():
  found = problems(_sources())
  assert not found, (
      "Private names of TensorFlow, Keras or Sonnet without a record: add a "
      "`Use` to replicator/patches/private_names.py (or a message to "
      "error_texts.py), or name an attribute `_replicator_...` if it is "
      "replicator's own:\n  " + "\n  ".join(found))


def test_both_lists_only_names_replicator_defines_that_records_cover():
  scans = scan(_sources())
  own = set().union(*(s.defined for s in scans.values())) - set(_tensorflows(scans))
  assert set(BOTH) <= own & _covered_names(), sorted(set(BOTH) - own & _covered_names())


def test_the_scan_finds_what_no_record_covers():
  source = '''
import re
from tensorflow.python.ops import array_ops
from tensorflow.python.ops import collective_ops

_WORDS = re.compile("kaput")

class Thing:
  def __init__(self):
    self._mine = 1

  def use(self, x, error):
    array_ops.no_such_function(x)
    collective_ops.all_reduce_v2(x)  # recorded
    x._no_such_attribute
    self._mine
    getattr(x, "_another_one", None)
    if "boom" in str(error) or _WORDS.search(str(error)):
      return tf.__internal__.no_such_thing.here
'''
  found = problems({"replicator.scan_test": source})
  assert found == [
      "replicator.scan_test imports the private module tensorflow.python.ops.array_ops",
      "replicator.scan_test uses tensorflow.python.ops.array_ops.no_such_function",
      "replicator.scan_test uses tf.__internal__.no_such_thing.here",
      "replicator.scan_test:17 uses the attribute _another_one",
      "replicator.scan_test:15 uses the attribute _no_such_attribute",
      "replicator.scan_test:18 matches 'boom' against an error's text",
      "replicator.scan_test:18 matches 'kaput' against an error's text",
  ], found
