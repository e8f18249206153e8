"""The folder-to-report workflow (``loopfuse report DIR --goal TEXT``); see docs/pipelines.md."""

from orchestrator.report.checks import draft_problems, leaked_markup
from orchestrator.report.run import SAMPLE_FOLDER, start_report
from orchestrator.report.scan import scan_folder
from orchestrator.report.workflow import ReportOptions, report_pipeline, simulated_models

__all__ = [
    "SAMPLE_FOLDER",
    "ReportOptions",
    "draft_problems",
    "leaked_markup",
    "report_pipeline",
    "scan_folder",
    "simulated_models",
    "start_report",
]
