"""The course as an application: the notebook runner, parameter schemas, summary, self-check, HTML export."""
