"""Which profile of a bundle a machine loads: the one of its own machine class.

A bundle (``artifacts.bundle``) holds one profile per machine class (``providers.machineclass``).
:func:`choose_profile` finds this machine's class among them. Without it, ``strict`` refuses
(exit 1) naming this class and the bundle's; ``accept_machine=True`` (or the ``warn`` and
``allow`` policies) takes the nearest class and says which, and why it is the nearest. A class
can also be named (``machine_class``: an export for another machine, a replica that knows its
node's class), and a Ray node's CPUs replace this process's CPU budget (``node_cpus``). Before a
profile is handed on, its files are checked against bundle.json's hashes (exit 1 when one is
missing or changed) and its own recorded class against the one the bundle files it under.
"""

from __future__ import annotations

import logging
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ortpilot.artifacts.bundle import Bundle, BundleEntry, check_files, read_bundle
from ortpilot.artifacts.profile import read_profile
from ortpilot.errors import StampMismatchError, UsageError, VerificationError
from ortpilot.providers.machineclass import MachineClass, check_class, differences, nearest_class, this_class

log = logging.getLogger("ortpilot")


class ClassMismatchWarning(UserWarning):
    """No profile of a bundle is for this machine's class; the nearest one loads (policy ``warn``)."""


@dataclass(frozen=True)
class BundleChoice:
    """The profile a machine takes from a bundle, and how it was chosen."""

    bundle: Path  # the bundle.json
    profile: Path  # the chosen class's profile.json
    chosen: MachineClass
    here: MachineClass | None  # this machine's class (None when the class was named)
    how: str  # "this machine's class" | "named" | "nearest"
    note: str  # what a person should know: the nearest class, and what differs
    classes: list[str]  # every class the bundle holds
    complete: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "bundle": str(self.bundle),
            "profile": str(self.profile),
            "class": self.chosen.to_dict(),
            "here": self.here.to_dict() if self.here else None,
            "how": self.how,
            "note": self.note,
            "classes": list(self.classes),
            "complete": self.complete,
        }


def bundle_classes(bundle: Bundle) -> list[MachineClass]:
    """Each entry's class, checked against its own id (an edited key is exit 2 naming the entry)."""
    out = []
    for i, entry in enumerate(bundle.entries):
        try:
            out.append(check_class(entry.machine_class, f"classes[{i}].class"))
        except ValueError as exc:
            raise UsageError(
                f"Bundle '{bundle.path}' has an invalid class record: {exc}. Write the bundle again with "
                "'ortpilot tune ... --ray' instead of editing it."
            ) from None
    return out


def choose_profile(
    path: str | os.PathLike,
    *,
    policy: str = "strict",
    machine_class: str | None = None,
    node_cpus: int | None = None,
    accept_machine: bool = False,
    check_all: bool = False,
) -> BundleChoice:
    """The profile of ``path``'s bundle for this machine (or the named class), its files checked.

    ``check_all`` checks the files of every class, not only the chosen one (``ortpilot verify``).
    """
    bundle = read_bundle(path)
    classes = bundle_classes(bundle)
    if machine_class is not None:
        here, how, note = None, "named", ""
        entry = bundle.entry(machine_class)
        if entry is None:
            raise UsageError(
                f"Bundle '{bundle.path}' has no class '{machine_class}'; it holds {_listing(bundle)}. Name one of "
                "those (or leave the class out to take this machine's own)."
            )
        chosen = classes[bundle.entries.index(entry)]
    else:
        here = this_class(node_cpus)
        chosen, how, note = _this_or_nearest(bundle, classes, here, policy=policy, accept_machine=accept_machine)
        entry = bundle.entries[classes.index(chosen)]
    for other in bundle.entries if check_all else [entry]:
        check_files(bundle, other)
    profile = bundle.profile_path(entry)
    _check_recorded_class(bundle, entry, profile)
    return BundleChoice(bundle.path, profile, chosen, here, how, note, bundle.names(), bundle.complete)


def _this_or_nearest(
    bundle: Bundle, classes: list[MachineClass], here: MachineClass, *, policy: str, accept_machine: bool
) -> tuple[MachineClass, str, str]:
    exact = next((c for c in classes if c.id == here.id), None)
    if exact is not None:
        return exact, "this machine's class", ""
    near = nearest_class(here, classes)
    if near is None or (policy == "strict" and not accept_machine):
        fix = (
            "or load the nearest class anyway with accept_machine=True (--accept-machine on the command line)"
            if near is not None
            else "the bundle holds no profile at all"
        )
        raise VerificationError(
            f"Bundle '{bundle.path}' holds no profile for this machine's class, {here.describe()}; it holds "
            f"{_listing(bundle)}. A profile tuned for another class can lose here (other INT8 kernels, more "
            "threads than this machine's CPUs). Tune this class into the bundle ('ortpilot tune MODEL --ray "
            f"ADDRESS -o {bundle.root}' on a cluster with a node of this class), {fix}."
        )
    note = (
        f"no profile for this machine's class {here.name}; took the nearest class, {near.name} "
        f"({'; '.join(differences(here, near))})"
    )
    if accept_machine or policy == "allow":
        log.info("Bundle '%s': %s.", bundle.path, note)
    else:
        log.warning("Bundle '%s': %s.", bundle.path, note)
        warnings.warn(f"Bundle '{bundle.path}': {note}.", ClassMismatchWarning, stacklevel=4)
    return near, "nearest", note


def _listing(bundle: Bundle) -> str:
    held = ", ".join(bundle.names()) or "no class"
    missing = [m["class"]["name"] for m in bundle.missing]
    return held + (f" (not tuned: {', '.join(missing)}; the bundle is incomplete)" if missing else "")


def _check_recorded_class(bundle: Bundle, entry: BundleEntry, profile: Path) -> None:
    """The profile must be the one tuned for the class the bundle files it under."""
    recorded = (read_profile(profile).get("machine_class") or {}).get("id")
    if recorded != entry.id:
        raise StampMismatchError(
            f"Bundle '{bundle.path}' files '{profile}' under class {entry.name} (id {entry.id}), but the profile "
            f"was tuned for {'class id ' + str(recorded) if recorded else 'no recorded class'}. Write the bundle "
            "again with 'ortpilot tune ... --ray'."
        )


__all__ = ["BundleChoice", "ClassMismatchWarning", "bundle_classes", "choose_profile"]
