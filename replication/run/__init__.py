"""The run machinery: the runner that executes the notebooks under papermill (runner), the record a notebook keeps
while it runs (workbook), the notebooks' parameter classes (settings) and the results store's command line
(results)."""
