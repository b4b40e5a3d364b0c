"""The trace formats ``datasets.traces`` reads, one module per format (``native``,
``philly``, ``helios``, ``alibaba``, ``swf``), each normalising a table into the standard
columns (``columns.standard_columns``) whose rows ``datasets.traces`` checks and turns into
jobs; ``tables`` reads text, CSV and Parquet files as tables of strings, refusing what is
no trace (``TraceFormatError``); ``columns`` holds the column expressions they share."""
