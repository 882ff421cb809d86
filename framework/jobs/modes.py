"""The trainer's built-in modes, registered in the order `--mode` lists
them (mode_registry.py). A new mode is its module plus one line here."""
from cadence.framework.jobs import export_mode
from cadence.framework.jobs import inspect_model_mode
from cadence.framework.jobs import inspect_params_mode
from cadence.framework.jobs import inspect_pipeline_mode
from cadence.framework.jobs import mode_registry
from cadence.framework.jobs import plan_mode
from cadence.framework.jobs import sync_mode

BUILT_IN = (
    sync_mode.SyncMode,
    inspect_params_mode.InspectParamsMode,
    inspect_model_mode.InspectModelMode,
    inspect_pipeline_mode.InspectPipelineMode,
    export_mode.ExportMode,
    plan_mode.PlanMode,
)
for _mode in BUILT_IN:
  mode_registry.Register(_mode)
NAMES = tuple(m.NAME for m in BUILT_IN)
