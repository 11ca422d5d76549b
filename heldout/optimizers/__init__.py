"""heldout's reference optimizers, and how an optimizer is named, found and loaded.

Each reference optimizer is a callable ``optimize(view, seed) -> Candidate`` that touches the task
only through the :class:`~heldout.contracts.TaskView` it is given (``seed``, ``placebo``,
``local-search``, ``reflective``, ``constant-search``, and the real libraries through
:mod:`heldout.adapters`: ``gepa``, ``dspy-mipro``, ``dspy-gepa``, ``openevolve``). The rooms:

* :mod:`.registry`: the names ``--optimizer`` accepts (reference names, aliases, plugins of the
  entry-point group ``heldout.optimizers``) and the ``module:function`` each names;
* :mod:`.specs`: a spec's options (``NAME?width=4``) and which specs are heldout's own code;
* :mod:`.loading`: finding, checking and loading an optimizer's code (user code found by path,
  never run by the harness), with :mod:`.user_modules` (where a module's file is);
* :mod:`.resolved`: the one decided value of what a method runs; :mod:`.minimums`: the smallest
  budget each optimizer can use.

This module only re-exports the names the rest of heldout and its users import."""

from heldout.optimizers.loading import (check_function, check_optimizer, is_heldout_code, load_function,
                                        locate_target, optimizer_code_sha256, resolve_optimizer, user_modules)
from heldout.optimizers.registry import (ALIASES, ENTRY_POINT_GROUP, REFERENCE_OPTIMIZERS, PluginSkipped,
                                         canonical_name, optimizer_target, plugin_optimizers)
from heldout.optimizers.specs import (CODE_OPTIONS, OPTIMIZER_OPTIONS, check_options, code_options,
                                      is_reference_optimizer, settings_type, split_spec, user_code)
from heldout.optimizers.user_modules import UserModule, find_module_source

__all__ = [
    "ALIASES", "CODE_OPTIONS", "ENTRY_POINT_GROUP", "OPTIMIZER_OPTIONS", "PluginSkipped", "REFERENCE_OPTIMIZERS",
    "UserModule", "canonical_name", "check_function", "check_optimizer", "check_options", "code_options",
    "find_module_source", "is_heldout_code", "is_reference_optimizer", "load_function", "locate_target",
    "optimizer_code_sha256", "optimizer_target", "plugin_optimizers", "resolve_optimizer", "settings_type",
    "split_spec", "user_code", "user_modules",
]
