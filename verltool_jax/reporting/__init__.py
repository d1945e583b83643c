"""What the user sees: metrics (JSONL + TensorBoard), the progress line, plots, HTML report."""

from verltool_jax.reporting.html_report import render_report, write_trajectory_report
from verltool_jax.reporting.metrics_writer import MetricsWriter, read_metrics
from verltool_jax.reporting.plots import plot_metrics
from verltool_jax.reporting.progress import ProgressBar, format_progress

__all__ = [
    "MetricsWriter",
    "ProgressBar",
    "format_progress",
    "plot_metrics",
    "read_metrics",
    "render_report",
    "write_trajectory_report",
]
