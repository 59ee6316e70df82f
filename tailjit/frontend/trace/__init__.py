"""What the entries trace a function with: the values it captures (``captures``), speculation on values read
from data (``speculate``), and eager's checks of in-place casts (``inplace_casts``)."""
