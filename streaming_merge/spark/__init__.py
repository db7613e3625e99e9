"""The Spark and JVM ground floor every other part stands on: JVM classes by full name (``jvm``),
py4j answers sent without Nagle's delay (``answers_at_once``), per-SparkContext caches
(``per_context``), the task slots a session has (``slots``), temporary SQL settings (``conf``),
interpreted execution for small inputs (``interpreted``), phase profiling and job counts
(``profile``), the driver's class-data-sharing archive (``class_archive``) and start-up marks
(``startup_marks``).

Nothing here knows Delta or MERGE; the table, merge and streaming layers import from here.
"""
