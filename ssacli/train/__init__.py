"""Training: fine-tuning (finetune.py), fresh models (scratch.py), whole runs as the commands start
them (runs.py). Nothing heavy is imported here: the CLI reads :data:`DATA_FORMS` for its help and
checks --data with :func:`require_data`, :func:`check_data` and :func:`check_data_fits` (and a
fresh model's text with :func:`require_text_data`) before the model stack loads."""

from pathlib import Path

from ..defaults import ICL_POINTS
from ..errors import InputError, UsageError
from ..models.icl_settings import check_task

DATA_FORMS = "a .txt file, a .jsonl file (field 'text'), a folder of them, or icl:TASK"  # what data= takes
# The smallest vocabulary of a fresh model's tokenizer (scratch.py): byte-level BPE's 256 bytes and
# the 4 merges of its minimum, plus the 5 special tokens (<pad>, <s>, </s>, <unk>, <mask>).
MIN_VOCAB = 265


def require_data(data: str | None, hint: str = "") -> None:
    """Refuse a run without training data (``hint``: how else the run could have it)."""
    if data is None:
        raise UsageError(f"--data is required: {DATA_FORMS}{hint}")


def check_data_path(data: str | Path) -> Path:
    """A text ``--data`` as the folder or file it names, refused (InputError) when it names nothing:
    :func:`ssacli.train.data.read_documents` reads what is there."""
    path = Path(data).expanduser()
    if not path.exists():
        raise InputError(
            f"--data {path} does not exist; give a text file, a .jsonl file, a folder or icl:TASK"
        )
    return path


def require_text_data(data: str | Path) -> None:
    """Refuse ``--data`` a fresh language model cannot train on (``ssacli train``): an ICL task, or a
    path that names nothing; checked before the model stack loads, and again where it is read."""
    if str(data).startswith("icl:"):
        raise UsageError(f"--data {data} is for ICL models; a language model trains on text files")
    check_data_path(data)


def check_data(spec: str) -> None:
    """What ``--data`` names, checked before any model loads: an ``icl:TASK[:points=N]`` spec's task
    and options (the model's own limits are checked when it has loaded,
    :func:`ssacli.train.data.parse_icl`). A file is read when the model has loaded, which decides
    first whether it takes text at all."""
    if spec.startswith("icl:"):
        icl_data_parts(spec, None)


def check_data_fits(spec: str, model: str) -> None:
    """Refuse, before the model stack, ``--data`` (``spec``; empty: not given) that names no task
    (:func:`check_data`) or is of the wrong form for the kind a local ``model`` folder declares
    (:func:`~ssacli.models.kinds.declared_kind`): text for an ICL model, an ``icl:TASK`` for a
    language model, with the lines loading ends in (:func:`ssacli.train.data.make_objective`); a
    kind only loading tells is left to it."""
    from ..models.builtins import ICL_FORMAT, read_meta
    from ..models.kinds import ModelKind, declared_kind
    from ..models.references import local_model_path

    path = local_model_path(model)
    kind = declared_kind(path) if path is not None and path.is_dir() else None
    check_data(spec)
    if not spec:  # not given: the run's own, or refused as missing
        return
    icl_data = spec.startswith("icl:")
    if kind == ModelKind.ICL and not icl_data:
        task = (read_meta(path, ICL_FORMAT) or {}).get("task")
        if isinstance(task, str):
            raise text_for_icl(task)
    elif kind not in (None, ModelKind.ICL) and icl_data:
        raise icl_for_text(spec, kind)


def text_for_icl(task: str) -> UsageError:
    """Text ``--data`` given to an ICL model of ``task``."""
    return UsageError(f"ICL models train on synthetic prompts: --data icl:{task}")


def icl_for_text(spec: str, kind: str) -> UsageError:
    """An ``icl:TASK`` ``--data`` given to a model of another ``kind``."""
    return UsageError(f"--data {spec} is for ssacli's ICL models; give text for a {kind} model")


def icl_data_parts(spec: str, max_points: int | None) -> tuple[str, int]:
    """(task, points) of an ``icl:TASK[:points=N]`` spec, N at most ``max_points`` (None: no bound)."""
    _, _, rest = spec.partition(":")
    task, _, options = rest.partition(":")
    check_task(task)
    points = ICL_POINTS
    for item in filter(None, options.split(",")):
        key, _, value = item.partition("=")
        if key != "points" or not value.isdigit() or not 1 <= int(value) <= (max_points or int(value)):
            most = f" <= {max_points}" if max_points else ""
            raise UsageError(f"--data {spec}: the only option is points=N with 1 <= N{most}")
        points = int(value)
    return task, points
