"""``privcal methods`` and ``privcal calibrate METHOD …``.

``calibrate`` has one subcommand per registered calibrator (plugins included);
its method options are generated from the calibrator's pydantic parameter
model (:mod:`privcal.cli.method_options`), so the CLI and the Python API accept exactly
the same parameters. ``predict`` and ``evaluate`` are :mod:`privcal.cli.predict_cmds`.
"""

from __future__ import annotations

from typing import Any

import click
import numpy as np
from click.core import ParameterSource

from privcal.calibrators import registry
from privcal.calibrators.base import PRIVACY_MODEL_LABELS
from privcal.cli import progress
from privcal.cli.app import (
    FILE,
    PrivcalGroup,
    add_common_options,
    complete_dataset,
    emit,
    json_option,
    main,
    pass_settings,
    table,
)
from privcal.cli.group_options import group_args, group_options
from privcal.cli.inputs import check_id_count, class_names, labels_in_probs, load_labels
from privcal.cli.method_options import (
    SCORE_OPTION,
    apply_deprecated,
    deprecated_aliases,
    param_options,
    parse_score_options,
    regression_options,
)
from privcal.cli.render import render_dry_run, render_release
from privcal.data.files import load_array
from privcal.data.label_columns import header_names
from privcal.errors import BudgetRefused, InvalidInput


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
        from privcal.accountant.calibration_request import CalibrationRequest

        as_json = kw.pop("as_json")
        params = {k: v for k, v in kw.items() if k in model.model_fields and v is not None}
        apply_deprecated(model, kw, params)
        ctx = click.get_current_context()
        for end in ("lower", "upper"):  # a range end not typed is the method's default
            if end in params and ctx.get_parameter_source(end) == ParameterSource.DEFAULT:
                del params[end]
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

        kw["labels"], label_column = labels_in_probs(kw.get("labels"), kw.get("label_column"),
                                                     kw.get("probs"))
        columns = kw.get("columns")
        if columns is not None and not kw.get("probs"):
            raise InvalidInput("--columns selects the probability columns of --probs")
        # label groups (--mondrian label) are read even in a dry run: they set the cost, and
        # name labels are matched to the header's classes as the run does (red team 20, F3)
        labels_shape_only = shape_only and kw.get("mondrian") != "label"
        arrays = {
            "scores": load("scores", "scores"),
            "probs": load("probs", "probs", matrix=True, columns=columns,
                          exclude=(label_column,) if label_column else ()),
            "labels": load_labels(kw.get("labels"), label_column, kw.get("probs"),
                                  labels_shape_only),
            "agents": load("agent_of", "agents", ids=True),
            "subjects": load("subjects", "subjects", ids=True),
            # regression: the scores are computed from predictions and targets
            "preds": load("preds", "preds"),
            "lower_preds": load("lower_preds", "lower_preds"),
            "upper_preds": load("upper_preds", "upper_preds"),
            "targets": load("targets", "targets"),
        }
        arrays["classes"] = class_names(kw.get("classes"), kw.get("probs"), columns,
                                     label_column, arrays["labels"], labels_shape_only)
        # a header that does not name the classes is recorded as the columns' names, so
        # that predict matches a later table by name (red team 16: read by position)
        arrays["column_names"] = None if arrays["classes"] is not None else header_names(
            kw.get("probs"), columns, label_column)
        check_id_count(kw.get("subjects"), arrays["subjects"], arrays, "subject ids")
        check_id_count(kw.get("agent_of"), arrays["agents"], arrays, "agent ids")
        acct = settings.accountant(existing="a dataset")
        request = CalibrationRequest.of(
            name, params,
            score=None if "score" in model.model_fields else kw.get("score"),
            score_options=parse_score_options(kw.get("score_option") or ()),
            shuffled=kw.get("shuffled", False),
            assume_unlinkable_features=kw.get("assume_unlinkable_features", False),
            score_range=kw.get("score_range"),
            **arrays,
            **group_args(kw),
        )  # fmt: skip
        if kw.get("dry_run"):
            report = dry_run(acct, request, dataset=kw["dataset"])
            emit(report, as_json=as_json, human=lambda: render_dry_run(report))
            if not report.allowed:  # as the run itself would (red team 17: `--dry-run &&`)
                raise click.exceptions.Exit(BudgetRefused.exit_code)
            return
        rows = next((int(np.shape(a)[0]) for a in arrays.values()
                     if a is not None and np.ndim(a) >= 1), 0)
        with progress.task(f"calibrating {name} on {rows} rows", None, size=rows):
            release = run_calibration(acct, request, dataset=kw["dataset"],
                                      requester=kw.get("requester"),
                                      idempotency_key=kw.get("idempotency_key"))
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
            "default: the --probs table's column names (a private method needs one of "
            "these; a non-private one falls back to the sorted names when all k appear)."))
        if "score" not in model.model_fields:
            opts.append(click.Option(
                ["--score"], help="Score for --probs/--labels: lac, aps, raps; for regression "
                "--preds/--targets: absolute, or cqr with --lower-preds/--upper-preds; with "
                "--scores, the score they were computed with (recorded with its options, "
                "which predict and evaluate then use)."))
        if "probs" not in needs:
            from privcal.calibrators.score_range import has_range

            opts += regression_options(has_range(model))
        opts.append(
            click.Option(["--score-option"], multiple=True, type=SCORE_OPTION,
                         help="Score option KEY=VALUE (repeat).")
        )
    if needs & {"scores"}:
        opts += group_options(cal)
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
                         help="Subject id of every row, read as text (required: each subject is "
                              "charged against the per-subject cap by its id, across runs).")
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
            ["--idempotency-key"],
            help="Retrying with the same key records the run once (another request under "
            "the key is refused).",
        ),
        click.Option(
            ["--dry-run"],
            is_flag=True,
            help=("Print the cost and what would remain, exit 3 if the budget would refuse "
                  "it; reads the inputs' row counts and the ids and groups a cost depends on "
                  "(--subjects, --agent-of, --groups, the labels with --mondrian label), no "
                  "score or probability; writes nothing."),
        ),
    ]
    model_label = PRIVACY_MODEL_LABELS.get(cal.privacy_model, cal.privacy_model)
    cmd = _MethodCommand(
        name,
        callback=callback,
        params=opts,
        help=f"{cal.summary}\n\nPrivacy model: {model_label}.",
        short_help=cal.summary,
    )
    return json_option(cmd)


#: the privacy options of one method or another: given to a method that takes another, the
#: error names the one it takes (red team 19: pcoqs --epsilon got "Did you mean '--json'?")
_PRIVACY_OPTIONS = ("--epsilon", "--rho")


class _MethodCommand(click.Command):
    """A calibrate METHOD command whose unknown privacy option names the method's own."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as exc:
            own = [o for p in self.params for o in getattr(p, "opts", [])
                   if o in _PRIVACY_OPTIONS]
            if exc.option_name in _PRIVACY_OPTIONS and exc.option_name not in own:
                takes = (f"takes {own[0]}" if own else "is not private: it takes neither")
                exc.message = (f"No such option: {exc.option_name} ({self.name} {takes}; "
                               "`privcal methods` lists each method's privacy model)")
                exc.possibilities = None
            raise


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


