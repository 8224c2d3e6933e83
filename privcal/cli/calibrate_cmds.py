"""``privcal methods``, ``privcal calibrate METHOD …``, ``privcal predict``, ``privcal evaluate``.

``calibrate`` has one subcommand per registered calibrator (plugins included);
its method options are generated from the calibrator's pydantic parameter
model, so the CLI and the Python API accept exactly the same parameters.
"""

from __future__ import annotations

import math
import types
import typing
from pathlib import Path
from typing import Any, Literal

import click
import numpy as np

from privcal import progress
from privcal.calibrators import registry
from privcal.calibrators.base import PRIVACY_MODEL_LABELS
from privcal.cli.app import (
    PrivcalGroup,
    add_common_options,
    complete_dataset,
    emit,
    info,
    json_option,
    main,
    pass_settings,
    table,
)
from privcal.cli.inputs import load_array, prob_column_names
from privcal.errors import InvalidInput

#: options every ``calibrate`` subcommand has; a parameter of the same name is fed from them
COMMON = {
    "dataset", "scores", "probs", "labels", "score", "score_option", "agent_of", "subjects",
    "requester", "idempotency_key", "dry_run", "as_json", "simulate", "shuffled",
    "assume_unlinkable_features", "columns", "label_column", "classes",
}  # fmt: skip

#: a file option: completes paths in the shell, keeps FILE:COLUMN specs as text
FILE = click.Path(dir_okay=False)


def _unwrap_optional(ann: Any) -> Any:
    if typing.get_origin(ann) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(ann) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return ann


def _click_type(ann: Any) -> Any:
    ann = _unwrap_optional(ann)
    if typing.get_origin(ann) is Literal:
        return click.Choice([str(a) for a in typing.get_args(ann)])
    return {int: int, float: float, str: str}.get(ann, str)


def deprecated_aliases(params_model: type) -> dict[str, str]:
    """{old name: field} for the old parameter names a model still accepts (validation aliases).

    Stored releases keep their old names (``audit verify`` reads them through the aliases);
    the CLI accepts the old flags hidden, as deprecated spellings of the new ones.
    """
    out: dict[str, str] = {}
    for name, field in params_model.model_fields.items():
        alias = field.validation_alias
        for choice in getattr(alias, "choices", ()) or ():
            if isinstance(choice, str) and choice != name:
                out[choice] = name
    return out


def _alias_dest(old: str) -> str:
    return f"deprecated__{old}"


def apply_deprecated(params_model: type, kw: dict[str, Any], params: dict[str, Any]) -> None:
    """Move values given under a deprecated flag (e.g. ``--beta``) onto their field."""
    ctx = click.get_current_context(silent=True)
    for old, name in deprecated_aliases(params_model).items():
        value = kw.pop(_alias_dest(old), None)
        if value is None:
            continue
        source = ctx.get_parameter_source(name) if ctx is not None else None
        if source == click.core.ParameterSource.COMMANDLINE:
            new = "--" + name.replace("_", "-")
            raise InvalidInput(f"give {new} or its deprecated spelling --{old}, not both")
        params[name] = value


def param_options(params_model: type) -> list[click.Option]:
    """Click options for every field of a calibrator's parameter model (``--kebab-case``).

    A field's old names (validation aliases) become hidden deprecated flags.
    """
    opts: list[click.Option] = []
    for old, name in deprecated_aliases(params_model).items():
        if name in COMMON:
            continue
        field = params_model.model_fields[name]
        opts.append(
            click.Option(
                ["--" + old.replace("_", "-"), _alias_dest(old)],
                type=_click_type(field.annotation),
                hidden=True,
                help=f"deprecated spelling of --{name.replace('_', '-')}",
            )
        )
    for name, field in params_model.model_fields.items():
        if name in COMMON:
            continue
        flag = "--" + name.replace("_", "-")
        ann = _unwrap_optional(field.annotation)
        required = field.is_required()
        default = None if required else field.get_default(call_default_factory=True)
        help_text = (field.description or "").rstrip(".")
        if ann is bool:
            opts.append(
                click.Option(
                    [f"{flag}/--no-{name.replace('_', '-')}", name],
                    default=bool(default),
                    show_default=True,
                    help=help_text,
                )
            )
            continue
        opts.append(
            click.Option(
                [flag, name],
                type=_click_type(field.annotation),
                required=required,
                default=default,
                show_default=default is not None,
                help=help_text,
            )
        )
    return opts


def _score_options(items: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise InvalidInput(f"--score-option takes KEY=VALUE, got {item!r}")
        key, raw = item.split("=", 1)
        low = raw.strip().lower()
        value: Any
        if low in ("true", "false"):
            value = low == "true"
        else:
            try:
                value = int(raw)
            except ValueError:
                try:
                    value = float(raw)
                except ValueError:
                    value = raw
        out[key.strip()] = value
    return out


def fmt_threshold(t: float) -> str:
    return "+inf (every label: the trivial set)" if math.isinf(t) and t > 0 else f"{t:.10g}"


def render_release(rel: Any, budget: Any | None = None) -> None:
    """Print a release for people."""
    cov = rel.coverage
    click.echo(
        f"Release {rel.id} on dataset {rel.dataset!r}: {rel.method} {rel.calibrator_version}"
    )
    click.echo(f"  threshold           {fmt_threshold(rel.threshold)}")
    n = rel.shape.get("n") if isinstance(rel.shape, dict) else getattr(rel.shape, "n", None)
    click.echo(f"  n                   {n}" + (f"   rank {cov.rank}" if cov.rank else ""))
    click.echo(f"  coverage guarantee  {cov.statement}")
    priv = rel.privacy or {}
    click.echo(f"  privacy             {priv.get('statement') or priv.get('summary') or priv}")
    dropped = (rel.diagnostics or {}).get("dropped_rows")
    if dropped is not None:
        click.echo(f"  rows dropped        {dropped.get('duplicate_subject', 0)} duplicate "
                   f"subject, {dropped.get('subject_over_cap', 0)} subject past its cap")
    if budget is not None:
        click.echo(f"  budget left         {getattr(budget, 'summary', budget)}")


def render_dry_run(report: Any) -> None:
    """Print a dry run for people."""
    cost = report.cost or {"kind": "none (non-private)"}
    click.echo(f"dry run on dataset {report.dataset!r}: nothing read, nothing written")
    click.echo(f"  cost        {', '.join(f'{k}={v}' for k, v in cost.items())}")
    click.echo(f"  allowed     {'yes' if report.allowed else 'NO'} ({report.reason})")
    click.echo(f"  remaining   {_amounts(report.remaining_before)} now")
    if report.remaining_after is not None:
        click.echo(f"              {_amounts(report.remaining_after)} after")


def _amounts(d: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in d.items()) or "(no cap)"


class CalibrateGroup(PrivcalGroup):
    """One subcommand per calibrator name, built on demand from the registry."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return registry.names()

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in registry.names():
            return None
        return add_common_options(_make_calibrate_command(name))


def _make_calibrate_command(name: str) -> click.Command:
    reg = registry.get(name)
    cal = reg.calibrator
    model = cal.Params
    needs = set(cal.inputs)

    @pass_settings
    def callback(settings: Any, **kw: Any) -> None:
        from privcal.accountant.calibration import calibrate as run_calibration
        from privcal.accountant.calibration import dry_run

        as_json = kw.pop("as_json")
        params = {k: v for k, v in kw.items() if k in model.model_fields and v is not None}
        apply_deprecated(model, kw, params)
        if "score" in model.model_fields and kw.get("score") is not None:
            params["score"] = kw["score"]
        if getattr(cal, "interactive", False) and not kw.get("simulate"):
            raise InvalidInput(
                f"{name} is interactive: open a collection session "
                f"(privcal session open {name} …) or simulate the users with --simulate"
            )
        shape_only = bool(kw.get("dry_run"))

        def load(option: str, what: str, matrix: bool = False, ids: bool = False,
                 **extra: Any) -> Any:
            spec = kw.get(option)
            if not spec:
                return None
            return load_array(spec, what, matrix=matrix, shape_only=shape_only, ids=ids,
                              **extra)

        label_column = kw.get("label_column")
        columns = kw.get("columns")
        if columns is not None and not kw.get("probs"):
            raise InvalidInput("--columns selects the probability columns of --probs")
        arrays = {
            "scores": load("scores", "scores"),
            "probs": load("probs", "probs", matrix=True, columns=columns,
                          exclude=(label_column,) if label_column else ()),
            "labels": _labels(kw.get("labels"), label_column, kw.get("probs"), shape_only),
            "agents": load("agent_of", "agents", ids=True),
            "subjects": load("subjects", "subjects", ids=True),
        }
        arrays["classes"] = _classes(kw.get("classes"), kw.get("probs"), columns,
                                     label_column, arrays["labels"], shape_only)
        acct = settings.accountant()
        common = dict(
            dataset=kw["dataset"],
            score=None if "score" in model.model_fields else kw.get("score"),
            score_options=_score_options(kw.get("score_option") or ()),
            shuffled=kw.get("shuffled", False),
            assume_unlinkable_features=kw.get("assume_unlinkable_features", False),
            **arrays,
        )
        if kw.get("dry_run"):
            report = dry_run(acct, name, params, **common)
            emit(report, as_json=as_json, human=lambda: render_dry_run(report))
            return
        rows = next((int(np.shape(a)[0]) for a in arrays.values()
                     if a is not None and np.ndim(a) >= 1), 0)
        with progress.task(f"calibrating {name} on {rows} rows", None, size=rows):
            release = run_calibration(
                acct,
                name,
                params,
                requester=kw.get("requester"),
                idempotency_key=kw.get("idempotency_key"),
                **common,
            )
        budget = acct.budget(kw["dataset"])
        emit(
            {"release": release, "budget": budget},
            as_json=as_json,
            human=lambda: render_release(release, budget),
        )

    opts: list[click.Parameter] = [
        click.Option(["--dataset", "dataset"], required=True, help="Dataset whose budget pays.",
                     shell_complete=complete_dataset),
    ]
    opts += param_options(model)
    if needs & {"scores"} or "probs" in needs:
        if "probs" not in needs:
            opts.append(click.Option(["--scores"], type=FILE,
                                     help="Precomputed scores (n floats; FILE or FILE:COLUMN)."))
        opts.append(click.Option(
            ["--probs"], type=FILE,
            help="n×k probabilities (.npy/.npz/.csv/.parquet; FILE:FIRST:LAST picks columns)."))
        opts.append(click.Option(
            ["--columns"],
            help="The probability columns of a --probs table: FIRST:LAST (e.g. p0:p9) or A,B,C "
            "(default: every column but the label column)."))
        opts.append(
            click.Option(
                ["--labels"], type=FILE,
                help="n labels in [0, k)"
                + (" (the users' noisy labels)" if "probs" in needs else "")
                + "; FILE or FILE:COLUMN.",
            )
        )
        opts.append(click.Option(
            ["--label-column"],
            help="The labels' column: of the --labels table, or of the --probs table when "
            "--labels is not given."))
        opts.append(click.Option(
            ["--classes"],
            help="Class names in probability-column order (a,b,c), for labels that are names; "
            "default: the --probs table's column names, else the sorted names when all k "
            "appear."))
        if "score" not in model.model_fields:
            opts.append(
                click.Option(["--score"], help="Score for --probs/--labels: lac, aps, raps.")
            )
        opts.append(
            click.Option(["--score-option"], multiple=True, help="Score option KEY=VALUE (repeat).")
        )
    if "agents" in needs:
        opts.append(
            click.Option(
                ["--agent-of", "agent_of"],
                type=FILE,
                required=True,
                help="The agent id of every score (same length as the scores).",
            )
        )
    if cal.privacy_model == "local":
        opts.append(
            click.Option(["--subjects"], type=FILE,
                         help="Subject id of every row, read as text (default: row number).")
        )
        opts.append(
            click.Option(
                ["--shuffled"],
                is_flag=True,
                help="Reports went through a trusted shuffler: charge and record the "
                "amplified (ε, δ) (ldp-score on an (ε, δ) dataset only; others are refused).",
            )
        )
        if "probs" in needs:
            opts.append(
                click.Option(
                    ["--assume-unlinkable-features"],
                    is_flag=True,
                    help="Assert features do not identify users. Shuffled ldp-label is "
                    "refused even so: label-DP neighbours share the victim's features.",
                )
            )
        if getattr(cal, "interactive", False):
            opts.append(
                click.Option(
                    ["--simulate"],
                    is_flag=True,
                    help="Run the interactive protocol with simulated users on --scores.",
                )
            )
    if cal.privacy_model == "federated" and _has_cost(cal, model):
        opts.append(
            click.Option(
                ["--shuffled"],
                is_flag=True,
                help="Agents' messages went through a trusted shuffler (refused: an "
                "agent's message is ε-DP per record, so no shuffle bound applies).",
            )
        )
    opts += [
        click.Option(["--requester"], help="Who asks (recorded in the release)."),
        click.Option(
            ["--idempotency-key"], help="Retrying with the same key records the run once."
        ),
        click.Option(
            ["--dry-run"],
            is_flag=True,
            help="Print the cost and what would remain; read no data, write nothing.",
        ),
    ]
    model_label = PRIVACY_MODEL_LABELS.get(cal.privacy_model, cal.privacy_model)
    cmd = click.Command(
        name,
        callback=callback,
        params=opts,
        help=f"{cal.summary}\n\nPrivacy model: {model_label}.",
        short_help=cal.summary,
    )
    return json_option(cmd)


def _labels(spec: str | None, label_column: str | None, probs: str | None,
            shape_only: bool) -> Any:
    """The labels: ``--labels FILE[:COLUMN]``, ``--labels TABLE --label-column C``, or the
    column ``--label-column`` of the ``--probs`` table."""
    if label_column is not None:
        source = spec or probs
        if source is None:
            raise InvalidInput("--label-column names a column of --labels or of --probs")
        if ".csv:" in source or ".parquet:" in source or ".npz:" in source:
            raise InvalidInput(f"give the label column once: {source} or --label-column")
        return load_array(f"{source}:{label_column}", "labels", shape_only=shape_only)
    return load_array(spec, "labels", shape_only=shape_only) if spec else None


def _classes(spec: str | None, probs: str | None, columns: str | None,
              label_column: str | None, labels: Any, shape_only: bool) -> list[str] | None:
    """The class names: ``--classes a,b,c``; else, for labels that are names, the selected
    column names of a ``--probs`` table with a header; else None (the library's fallback:
    the sorted distinct labels when all k appear)."""
    from privcal.calibrators.class_labels import is_text_labels

    if spec is not None:
        if not probs:
            raise InvalidInput("--classes names the probability columns of --probs")
        return [c.strip() for c in spec.split(",")]
    if not probs or shape_only or not is_text_labels(labels):
        return None
    return prob_column_names(probs, columns, (label_column,) if label_column else ())


def _dummy_params(model: type) -> Any:
    # required fields (e.g. fedcp2-qq's epsilon) have no default: a placeholder valid for α and ε
    return model.model_construct(
        **{k: 0.5 if f.is_required() else f.default for k, f in model.model_fields.items()}
    )


def _has_cost(cal: Any, model: type) -> bool:
    try:
        return cal.cost(_dummy_params(model), _dummy_shape()) is not None
    except Exception:  # cannot tell from placeholders: offer the option
        return True


def _dummy_shape() -> Any:
    from privcal.calibrators.base import DataShape

    return DataShape(n=100, group_sizes=(50, 50))


@main.group("calibrate", cls=CalibrateGroup)
def calibrate() -> None:
    """Calibrate a conformal threshold on a dataset: charge, compute, record, print.

    Run `privcal calibrate METHOD --help` for a method's options, `privcal methods` for the list.
    """


@main.command("methods")
@json_option
def methods(as_json: bool) -> None:
    """List the calibrators, their privacy model and parameters."""
    rows = []
    for name in registry.names():
        reg = registry.get(name)
        cal = reg.calibrator
        fields = cal.Params.model_fields
        aliases: dict[str, list[str]] = {}
        for old, new in deprecated_aliases(cal.Params).items():
            aliases.setdefault(new, []).append(old)
        rows.append(
            {
                "name": name,
                "privacy_model": PRIVACY_MODEL_LABELS.get(cal.privacy_model, cal.privacy_model),
                "version": cal.version,
                "distribution": reg.distribution,
                "inputs": sorted(cal.inputs),
                "summary": cal.summary,
                "parameters": {
                    k: {
                        "required": f.is_required(),
                        "default": None
                        if f.is_required()
                        else f.get_default(call_default_factory=True),
                        "description": f.description,
                        **(
                            {"deprecated_aliases": sorted(aliases[k])}
                            if aliases.get(k)
                            else {}
                        ),
                    }
                    for k, f in fields.items()
                },
            }
        )

    def human() -> None:
        click.echo(
            table(
                [
                    {
                        "method": r["name"],
                        "privacy model": r["privacy_model"],
                        "parameters": ", ".join(r["parameters"]),
                        "summary": r["summary"],
                    }
                    for r in rows
                ]
            )
        )

    emit(rows, as_json=as_json, human=human)


OUT_SUFFIXES = (".npy", ".npz", ".json", ".csv", ".parquet")


def _write_sets(sets: np.ndarray, out: str | None, as_json: bool,
                classes: list[str] | None = None) -> None:
    """Write the n×k boolean sets: ``.npy``/``.npz`` as the matrix, ``.json`` as lists of
    labels, ``.csv``/``.parquet`` as a table with one 0/1 column per class (named by the
    release's class names, else ``0`` … ``k-1``) and the set ``size``."""
    if out is None:
        return
    path = Path(out)
    if path.is_dir():
        raise InvalidInput(f"--out {out}: is a directory; name a file")
    if not path.parent.is_dir():
        raise InvalidInput(f"--out {out}: the directory {path.parent} does not exist")
    suffix = path.suffix.lower()
    if suffix not in OUT_SUFFIXES:
        raise InvalidInput(f"--out must end in {', '.join(OUT_SUFFIXES)}, got {path.name}")
    try:
        _write_sets_to(sets, path, suffix, classes)
    except OSError as exc:
        raise InvalidInput(f"--out {out}: cannot write it ({exc.strerror or exc})") from exc
    if not as_json:
        info(f"wrote {sets.shape[0]} prediction sets to {path}")


def _write_sets_to(sets: np.ndarray, path: Path, suffix: str,
                   classes: list[str] | None) -> None:
    from privcal.calibrators.prediction_sets import set_labels

    if suffix == ".npy":
        np.save(path, sets)
    elif suffix == ".npz":
        np.savez_compressed(path, sets=sets)
    elif suffix == ".json":
        import json

        path.write_text(json.dumps(set_labels(sets, classes)))
    else:
        import pyarrow as pa

        names = classes if classes is not None else [str(j) for j in range(sets.shape[1])]
        if "size" in names:
            raise InvalidInput("a class is named 'size', the column of set sizes; "
                               "write --out .json or .npy")
        cols = {names[j]: pa.array(sets[:, j].astype(np.int8)) for j in range(sets.shape[1])}
        cols["size"] = pa.array(sets.sum(axis=1).astype(np.int64))
        tab = pa.table(cols)
        if suffix == ".csv":
            import pyarrow.csv as pcsv

            pcsv.write_csv(tab, path)
        else:
            import pyarrow.parquet as pq

            pq.write_table(tab, path)


@main.command("predict")
@click.option("--release", "release_id", type=int, required=True, help="Release id.")
@click.option("--probs", required=True, type=FILE,
              help="n×k probabilities of the points to predict (FILE:FIRST:LAST picks columns).")
@click.option("--columns", default=None, help="The probability columns of a --probs table.")
@click.option("--score", default=None, help="Score name, if the release was made from --scores.")
@click.option(
    "--out", default=None, type=FILE,
    help="Write the sets to .npy/.npz (boolean n×k), .json (lists), or .csv/.parquet (one 0/1 "
    "column per class, and the size).",
)
@json_option
@pass_settings
def predict(
    settings: Any, release_id: int, probs: str, columns: str | None, score: str | None,
    out: str | None, as_json: bool
) -> None:
    """Prediction sets {y : S(x, y) ≤ threshold} of a released threshold."""
    from privcal.calibrators.prediction_sets import release_classes, release_sets, set_labels

    rel = settings.ledger().release(release_id)
    sets = release_sets(rel, load_array(probs, "probs", matrix=True, columns=columns),
                        score_name=score)
    classes = release_classes(rel)
    _write_sets(sets, out, as_json, classes)
    lists = set_labels(sets, classes)
    sizes = sets.sum(axis=1)

    def human() -> None:
        if out is None:
            for i, s in enumerate(lists[:20]):
                click.echo(f"{i}\t{s}")
            if len(lists) > 20:
                click.echo(f"… {len(lists) - 20} more (use --out FILE or --json)")
        click.echo(f"{len(lists)} sets, mean size {sizes.mean():.3f}", err=out is None)

    doc: dict[str, Any] = {"release": rel.id, "threshold": rel.threshold, "sets": lists}
    if classes is not None:
        doc["classes"] = classes
    emit(doc, as_json=as_json, human=human)


@main.command("evaluate")
@click.option("--release", "release_id", type=int, required=True, help="Release id.")
@click.option("--probs", required=True, type=FILE, help="n×k probabilities of held-out points.")
@click.option("--columns", default=None, help="The probability columns of a --probs table.")
@click.option("--labels", default=None, type=FILE, help="Their true labels (FILE or FILE:COLUMN).")
@click.option("--label-column", default=None,
              help="The labels' column, of --labels or of the --probs table.")
@click.option("--score", default=None, help="Score name, if the release was made from --scores.")
@json_option
@pass_settings
def evaluate(
    settings: Any, release_id: int, probs: str, columns: str | None, labels: str | None,
    label_column: str | None, score: str | None, as_json: bool
) -> None:
    """Empirical coverage, mean set size and singleton fraction on held-out data."""
    from privcal.calibrators.evaluation import evaluate_sets
    from privcal.calibrators.prediction_sets import release_classes, release_sets

    if labels is None and label_column is None:
        raise click.UsageError("give the true labels: --labels FILE or --label-column COLUMN")
    rel = settings.accountant().release(release_id)  # coverage typed (.lower)
    exclude = (label_column,) if label_column else ()
    sets = release_sets(rel, load_array(probs, "probs", matrix=True, columns=columns,
                                        exclude=exclude), score_name=score)
    ev = evaluate_sets(sets, _labels(labels, label_column, probs, False), rel.coverage.lower,
                       classes=release_classes(rel))

    def human() -> None:
        click.echo(f"release {rel.id} ({rel.method}), {ev.n} held-out points")
        click.echo(
            f"  coverage            {ev.coverage:.4f}   (guaranteed ≥ {ev.guaranteed_lower:.4f})"
        )
        click.echo(f"  mean set size       {ev.mean_set_size:.3f}")
        click.echo(f"  singleton fraction  {ev.singleton_fraction:.3f}")
        verdict = (
            "meets"
            if ev.meets_guarantee
            else (
                "below, but consistent with (95% upper bound " + f"{ev.coverage_upper_95:.4f})"
                if ev.consistent_with_guarantee
                else "BELOW and inconsistent with"
            )
        )
        click.echo(f"  guarantee           {verdict} the recorded guarantee")

    emit(ev, as_json=as_json, human=human)
