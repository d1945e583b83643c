"""Process-level set-up that entry points share: the console and the run's log file
(``console``), glibc malloc tunables and the re-exec that applies them
(``malloc_tuning``), XLA's CPU thread flags (``cpu_threads``), and the watchdog that
kills what a run started when it dies (``lifeline``). Imports nothing from the project."""
