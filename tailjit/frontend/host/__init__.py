"""The host function of a planned graph: its Python (``code``), the whole training graph as one autograd node
(``graph_autograd``), and ``compile_graph``, where every entry ends (``function``)."""
