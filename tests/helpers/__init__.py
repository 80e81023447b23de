"""What tests import: tiny models (models), the CLI in-process (cli), reference formulas (naive), report
results (report_fixtures), the result schema (result_schema), the monitor's worker (monitor_worker).
Nothing is imported here, so a spawned worker imports only its own module."""
