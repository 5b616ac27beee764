"""The API reference builds from the docstrings, and the docstrings hold.

The reference is `python -m pdoc replicator --docformat google -o docs/api`
(CONTRIBUTING.md). Here it is built into a temporary folder with pdoc's warnings
as errors, every public name must have a docstring that pdoc renders, every
`Args:` section must name parameters the signature has, and the docstrings'
examples must run.
"""

import doctest
import importlib
import inspect
import os
import re
import subprocess
import sys

import pytest

import replicator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Modules whose docstrings carry `>>>` examples.
DOCTESTED = ("replicator", "replicator.gpu", "replicator.mesh", "replicator.checkpoint",
             "replicator.inputs.input_context", "replicator.inputs.positions")

_BUILD = r"""
import pathlib, sys, warnings
import pdoc, pdoc.render
warnings.simplefilter("error")
# pdoc refuses subprocesses while importing (platform.processor runs `uname`): harmless.
warnings.filterwarnings("ignore", message="Suppressed execution")
pdoc.render.configure(docformat="google")
pdoc.pdoc("replicator", output_directory=pathlib.Path(sys.argv[1]))
"""


def _args_named(doc: str):
  """The parameter names an `Args:` section of a Google-style docstring lists."""
  match = re.search(r"^([ \t]*)Args:[ \t]*\n((?:\1[ \t]+.*\n|[ \t]*\n)+)", doc + "\n",
                    re.M)
  if not match:
    return []
  indent = None
  names = []
  for line in match.group(2).splitlines():
    if not line.strip():
      continue
    width = len(line) - len(line.lstrip())
    indent = width if indent is None else indent
    if width == indent:  # `name: text`, `name (type): text` or `a, b: text`
      for name in line.strip().split(":")[0].split(","):
        names.append(name.strip().split(" ")[0].lstrip("*"))
  return names


def _inherited_doc(cls, name: str):
  """The docstring of `name` in a base class of `cls`: an override of a
  `tf.Variable` method means what TensorFlow documents."""
  for base in getattr(cls, "__mro__", ())[1:]:
    if name in vars(base) and inspect.getdoc(vars(base)[name]):
      return inspect.getdoc(vars(base)[name])
  return None


def docstring_problems(obj, name: str):
  """What is wrong with the docstrings of `obj` (and its public methods)."""
  problems = []
  targets = [(name, obj)]
  if inspect.isclass(obj):
    targets += [(f"{name}.{n}", m) for n, m in vars(obj).items()
                if not n.startswith("_") and (inspect.isfunction(m) or isinstance(m, property))]
  for label, target in targets:
    function = target.fget if isinstance(target, property) else target
    doc = inspect.getdoc(target) or _inherited_doc(obj, label.rsplit(".", 1)[-1])
    if not doc:
      problems.append(f"{label}: no docstring")
      continue
    signature_of = function.__init__ if inspect.isclass(function) else function
    try:
      parameters = set(inspect.signature(signature_of).parameters)
    except (TypeError, ValueError):
      continue
    for arg in _args_named(doc):
      if arg not in parameters:
        problems.append(f"{label}: Args names {arg!r}, which is not a parameter "
                        f"(parameters: {sorted(parameters - {'self'})})")
  return problems


def test_pdoc_builds_the_reference_of_every_public_name(tmp_path):
  result = subprocess.run([sys.executable, "-c", _BUILD, str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  page = (tmp_path / "replicator.html").read_text()
  for name in replicator.__all__:
    if inspect.ismodule(getattr(replicator, name)):  # a page of its own
      assert (tmp_path / "replicator" / f"{name}.html").exists(), name
    else:
      assert f'id="{name}"' in page, f"{name} is missing from the reference"


@pytest.mark.parametrize("name", replicator.__all__)
def test_every_public_name_has_docstrings_that_match_its_signature(name):
  obj = getattr(replicator, name)
  if inspect.ismodule(obj):
    assert inspect.getdoc(obj), f"replicator.{name}: no module docstring"
    return
  assert docstring_problems(obj, f"replicator.{name}") == []


def test_the_docstring_check_finds_a_broken_docstring():
  def apply(grads, variables):
    """Applies the update.

    Args:
      gradients: one per variable.
      variables: the variables.
    """
    del grads, variables

  class Documented:
    """A class."""

    def undocumented(self):
      pass

  assert docstring_problems(apply, "apply") == [
      "apply: Args names 'gradients', which is not a parameter "
      "(parameters: ['grads', 'variables'])"]
  assert docstring_problems(Documented, "Documented") == [
      "Documented.undocumented: no docstring"]


@pytest.mark.parametrize("module_name", DOCTESTED)
def test_docstring_examples_run(module_name):
  module = importlib.import_module(module_name)
  failures, tried = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
  assert tried > 0, f"{module_name} has no examples: remove it from DOCTESTED"
  assert failures == 0
