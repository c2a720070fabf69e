"""agents: RL algorithms that train against any sage_env environment."""
