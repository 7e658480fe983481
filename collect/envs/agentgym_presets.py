"""One `Preset` per AgentGym environment: its protocol, its prompt (in trajlake's words) and its idea of success.

Each preset was read off AgentGym's own client (../shared/agentgym/clients/NAME.py) and server (AgentGym commit
3ef9235): the /create body and reply, how /reset names a task, the step reply's keys, /close or not, what the
client does to an action before sending it, and what a win is. `register()` makes each one an env named
`agentgym/NAME`; `agentgym/trajlake` plays trajlake's own server (`trajlake serve-env`).

The instructions tell the model the task and the exact action grammar each server parses; the reply format is
the action template's (`react` by default for these envs: "Thought:\\n...\\n\\nAction:\\n...", as AgentGym's
agents reply; see `Preset.template`).
"""

from __future__ import annotations

from trajlake.collect.envs.agentgym_protocol import (
    Preset,
    first_line,
    first_line_alnum,
    sql_from_block,
    strip_spaces,
    tool_call_line,
    win_full_score,
    win_positive_score,
    win_reward_at_least_one,
)
from trajlake.core.errors import TrajlakeError


def _textcraft_expert():
    from trajlake.collect.envs.textcraft_planner import TextCraftPlanner

    return TextCraftPlanner()


_TOOL_FORMAT = ("Call one tool per reply. The action line must read: NAME with Action Input: {JSON arguments}, "
                "e.g. get_latitude_longitude with Action Input: {\"name\": \"Paris\"}. When you know the answer, "
                "call finish with Action Input: {\"answer\": ...}.")


#: TextCraft's goals per crafting min-depth, in its server's order (it sorts its 544 goals by depth): goals 0..124
#: are depth 1, 125..415 depth 2, 416..532 depth 3, 533..543 depth 4. Read off AgentGym's crafting tree
#: (`CraftingTree.item_recipes_min_depth(1)`, as its server lists goals); tests/test_agentgym_splits.py checks it.
TEXTCRAFT_DEPTHS = ((1, 125), (2, 291), (3, 117), (4, 11))


def _tool(name: str, title: str, what: str, tools: str, n: int) -> Preset:
    """The five tool-use envs share one server shape: a task is created by index, rewards are progress."""
    return Preset(
        name, title, f"{what} Tools: {tools}. {_TOOL_FORMAT}", "TOOL with Action Input: {...} | finish",
        win_reward_at_least_one, create_task_field="id", id_field="env_idx", reset_field="id",
        first_observation="observe", can_close=False, cumulative_reward=True, clean_action=tool_call_line,
        create_returns_bare_int=True, size=n,
        splits={"test": (0, 20), "train": (20, n)} if n > 20 else {"test": (0, n)}, max_turns=20)


PRESETS: dict[str, Preset] = {p.name: p for p in [
    Preset("trajlake", "trajlake", "Solve the task each observation describes.",
           "(the served env's actions, as its observations say)", win_reward_at_least_one, send_task=True,
           template="think_action",
           splits={s: (0, None) for s in ("train", "val", "test")}, max_turns=10),
    Preset(
        "textcraft", "TextCraft",
        "Craft the goal item of Minecraft's recipes. The first message lists the crafting commands you may use "
        "and the goal. Take base ingredients from the environment with get, check what you hold with "
        "inventory, and craft with exactly one of the listed commands, quantities included (a generic "
        "ingredient such as planks may be given as a specific kind, e.g. oak planks).",
        "get N ITEM | craft N ITEM using N A, N B | inventory",
        win_reward_at_least_one, create_body={}, clean_action=first_line_alnum,
        invalid_prefixes=("Could not", "Wrong item format"), expert=_textcraft_expert, max_turns=30,
        # its server picks goal `data_idx % 544` of the recipe tree's goals, sorted by crafting min-depth
        size=544, difficulty_profile=TEXTCRAFT_DEPTHS),
    Preset(
        "babyai", "BabyAI",
        "You are in a grid room and must achieve the goal stated in the first message. Each observation "
        "describes what you see and lists the actions available right now; reply with one of them exactly.",
        "turn left | turn right | move forward | go to OBJ N | pickup OBJ N | drop | toggle | go through DOOR N "
        "| toggle and go through DOOR N | check available actions",
        win_positive_score, score_key="score", clean_action=first_line_alnum,
        invalid_prefixes=("The action is not recognized",), max_turns=30),
    Preset(
        "maze", "LMRL-Gym",
        "Reach the goal of a maze in as few moves as you can. Each observation gives the goal's position, yours, "
        "and the walls around you. Moving down adds 1 to your x position, moving right adds 1 to your y.",
        "move up | move down | move left | move right",
        win_reward_at_least_one, prefix="maze", reset_field="game", can_close=False, clean_action=first_line,
        size=25, splits={"test": (0, 25)}, max_turns=50),
    Preset(
        "wordle", "LMRL-Gym",
        "Guess a hidden five-letter word in at most six tries. Write a guess as its letters separated by "
        "spaces, e.g. s h i r e; it must be one of the words listed in the first message. Feedback gives a "
        "letter per position: g = right letter, right place; y = in the word, elsewhere; b = not in the word.",
        "L E T T R (a listed word, letters separated by spaces)",
        win_reward_at_least_one, prefix="wordle", reset_field="seed", can_close=False, clean_action=first_line,
        word_list_route="filtered_vocab", max_turns=6),
    Preset(
        "webshop", "WebShop",
        "Buy the product the instruction asks for in a web shop. Each observation shows the page; search when "
        "there is a search bar, click one of the clickable values shown, and finish by clicking Buy Now once "
        "the product and its options match.",
        "search[KEYWORDS] | click[VALUE]",
        win_full_score, id_field="env_idx", reset_field="session_id", obs_key="state", first_observation="observe",
        can_close=False, clean_action=first_line, create_returns_bare_int=True, max_turns=20),
    Preset(
        "alfworld", "AlfWorld",
        "Complete a household task in a text world (the task is stated in the first message, with the actions "
        "available there). Reply with one action per turn; \"Nothing happened.\" means the action did nothing.",
        "go to RECEP | take OBJ from RECEP | put OBJ in/on RECEP | open RECEP | close RECEP | toggle OBJ | "
        "heat/cool/clean OBJ with RECEP | examine OBJ | use OBJ | inventory | look",
        win_reward_at_least_one, reset_field="game", reset_extra=(("world_type", "Text"),), can_close=False,
        reset_suffix_key="available_actions", clean_action=first_line, invalid_prefixes=("Nothing happened",),
        size=2620, splits={"test": (2420, 2620), "train": (0, 2420)}, max_turns=50),
    Preset(
        "sciworld", "ScienceWorld",
        "Carry out a science experiment in a text world; the task is stated in the first message. Use the "
        "world's actions on the objects you see; the score rises as you complete the task's steps.",
        "look around | look at OBJ | look in OBJ | go to LOC | open/close OBJ | pick up OBJ | put down OBJ | "
        "move OBJ to OBJ | pour OBJ into OBJ | dunk OBJ into OBJ | mix OBJ | activate/deactivate OBJ | "
        "connect OBJ to OBJ | disconnect OBJ | use OBJ [on OBJ] | read OBJ | eat OBJ | flush OBJ | focus on OBJ | "
        "wait | wait1 | examine OBJ | task | inventory",
        win_full_score, score_key="score", score_scale=100.0, reset_prefix_key="task_description",
        clean_action=first_line, invalid_prefixes=("No known action matches",), max_turns=50),
    Preset(
        "sqlgym", "SQLGym",
        "Answer the question about the database described in the first message with one SQLite statement. "
        "Write it on one line inside a ```sql block; the result set is compared with the right answer's.",
        "```sql SELECT ...; ```",
        win_reward_at_least_one, id_field="env_idx", reset_field="item_id", obs_key="state",
        first_observation="observe", can_close=False, clean_action=sql_from_block, create_returns_bare_int=True,
        size=9828, splits={"test": (9428, 9628), "val": (9628, 9828), "train": (0, 9428)}, max_turns=1),
    _tool("weather", "weather", "Answer a question about the weather by calling weather tools.",
          "get_user_current_date, get_user_current_location, get_latitude_longitude, get_current_temp, "
          "get_temp_forecast, get_historical_temp, get_current_rain, get_rain_forecast, get_historical_rain, "
          "get_current_snow, get_snow_forecast, get_historical_snow, get_elevation, get_distance, "
          "get_current_air_quality_index, get_historical_air_quality_index, get_air_quality_level, "
          "check_valid_actions, finish", 343),
    _tool("movie", "movie", "Answer a question about films and people by calling movie database tools.",
          "get_search_movie, get_movie_details, get_movie_production_companies, get_movie_production_countries, "
          "get_movie_cast, get_movie_crew, get_movie_keywords, get_search_person, get_person_details, "
          "get_person_cast, get_person_crew, get_person_external_ids, get_movie_alternative_titles, "
          "get_movie_translation, check_valid_actions, finish", 238),
    _tool("todo", "todo", "Manage a to-do list as asked by calling to-do tools.",
          "get_user_current_date, get_user_current_location, get_projects, update_project, get_tasks, "
          "get_task_description, get_task_duration, complete_task, update_task, delete_task, check_valid_actions, "
          "finish", 155),
    _tool("academia", "academia", "Answer a question about papers and authors by calling citation-graph tools.",
          "loadPaperNet, loadAuthorNet, neighbourCheck, paperNodeCheck, authorNodeCheck, authorEdgeCheck, finish",
          20),
    _tool("sheet", "sheet", "Edit a spreadsheet as asked by calling spreadsheet tools (finish takes {}).",
          "open_sheet, del_sheet, freeze_data, get_A1_annotation, insert_cols, insert_rows, delete_batch_data, "
          "update_cell, update_cell_by_formula, update_range, sort_sheet_by_col, merge_cells, update_note, "
          "get_all_values, get_range_values, get_cell_value, get_value_by_formula, filter_cells, get_note, finish",
          20),
]}

def get_preset(preset: str | Preset) -> Preset:
    """A preset by name (or `agentgym/NAME`), or `preset` itself."""
    if isinstance(preset, Preset):
        return preset
    name = preset.removeprefix("agentgym/")
    try:
        return PRESETS[name]
    except KeyError:
        raise TrajlakeError(f"unknown AgentGym environment {preset!r}; valid: {', '.join(sorted(PRESETS))}") from None


def expert_for(preset: Preset):
    """A new scripted expert for `preset`'s env; TrajlakeError naming the envs that have one when it has none."""
    if preset.expert is None:
        have = sorted(p.env_name for p in PRESETS.values() if p.expert is not None)
        raise TrajlakeError(f"{preset.env_name} has no scripted expert (its tasks carry no ground truth); "
                            f"experts exist for: {', '.join(have)}")
    return preset.expert()


__all__ = ["PRESETS", "Preset", "expert_for", "get_preset", "strip_spaces"]
