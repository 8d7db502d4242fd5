"""The seven notebooks' parameter classes, each beside its notebook's code (`<folder>/params.py`): importing this
module registers them with replication.core.params. It imports no model machinery (no torch), so the runner can
check parameters before any kernel starts."""
from replication.papers.debate import params as debate_params  # noqa: F401
from replication.papers.elo_evolve import params as elo_evolve_params  # noqa: F401
from replication.papers.mae import params as mae_params  # noqa: F401
from replication.papers.malt import params as malt_params  # noqa: F401
from replication.papers.rlpr import params as rlpr_params  # noqa: F401
from replication.setup import params as setup_params  # noqa: F401
