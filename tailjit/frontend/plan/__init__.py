"""Planning a graph: regions to build and extern calls (``planner``), the steps they become (``steps``), and
what tailjit reports of each graph (``report``)."""
