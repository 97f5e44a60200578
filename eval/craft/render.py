"""What the CRAFT planner and reviser read (paper 002, §5.1-5.2, Table 17, App. E.1/E.7): observations, chat history.

The parsing half is ``eval.craft.react``; this module renders:

- :func:`build_observation`: the observation o_{i+1} (the revised text and the tools' feedback) that the planner
  reads as its next user turn, in the ``###OBSERVATION:`` form of App. E.1;
- :func:`render_history`: the planner's chat H_i (user turns = observations, assistant turns = thought + action),
  which is also the SFT format (§5.1.2: loss on t_i and a_i only, so on the assistant turns);
- :func:`render_step` / :func:`render_transcript`: a parsed step in the canonical Table 17 layout, and whole
  trajectories as the Table 17 text that fills E.1's ``[In Context Examples]`` slot;
- :func:`render_plan_input`: the plan lines the E.7 reviser reads after ``### INPUT:``.

This module is pure (no ray, vllm, deepspeed, torch or transformers).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from eval.craft.react import PlanLine, PlannerStep


def render_step(step: PlannerStep) -> str:
    """A parsed step in the canonical Table 17 layout (``eval.craft.react.parse_planner_output`` reads it back unchanged)."""
    tools = "\n".join(step.tool_calls)
    plan = render_plan_input(step.plan)
    return f"###THOUGHT: {step.thought}\n###ACTION:\n   -###TOOLS:\n{tools}\n   -###PLAN:\n{plan}"


def render_plan_input(plan: Sequence[PlanLine]) -> str:
    """Plan lines as the E.7 reviser reads them after ``### INPUT:``, one per line."""
    return "\n".join(f'Sentence: "{p.sentence}"; Improvement Plan: "{p.improvement_plan}"' for p in plan)


def build_observation(
    revised_text: str,
    constraint_feedback: Sequence[str] = (),
    quality_feedback: Mapping[str, Sequence[str]] | None = None,
    *,
    quality_score: float | None = None,
    tool_usage_feedback: Sequence[str] = (),
    include_feedback: bool = True,
) -> str:
    """The observation o_{i+1} the planner reads next: the revised text, then the tools' feedback.

    The paper gives the form ``###OBSERVATION: Tool's output result.`` (E.1) and says the observation is the
    revision plus its tool feedback (§5.1.1, §5.2); the section wording below is ours.

    Args:
        revised_text: y_{i+1}.
        constraint_feedback: One message per checked constraint (``eval.craft.tools`` results).
        quality_feedback: E.8 suggestions per aspect, e.g. ``{"Fluency": ["Original: ...; Suggestion: ..."]}``,
            in the order given; empty aspects are left out.
        quality_score: The text-quality tool's score (``text_eval() -> score``), if shown.
        tool_usage_feedback: Corrective messages about the planner's tool calls (trajectory synthesis only).
        include_feedback: False renders the revised text alone (the paper's "w/o Feedback" ablation).
    """
    parts = [f"###OBSERVATION: The revised text:\n{revised_text.strip()}"]
    if include_feedback:
        if tool_usage_feedback:
            parts.append("Tool usage feedback:\n" + "\n".join(f"- {m}" for m in tool_usage_feedback))
        if constraint_feedback:
            parts.append("Constraint check feedback:\n" + "\n".join(f"- {m}" for m in constraint_feedback))
        quality = [f"Text quality score: {quality_score:.2f}"] if quality_score is not None else []
        for aspect, lines in (quality_feedback or {}).items():
            if lines:
                quality.append(f"{aspect}:\n" + "\n".join(f"- {line}" for line in lines))
        if quality:
            parts.append("Text quality feedback:\n" + "\n".join(quality))
    parts.append(("Use this feedback to write" if include_feedback else "Write") + " new tool calls and a new revision "
                 "plan for the revised text, following the response format.")
    return "\n\n".join(parts)


def render_history(
    initial_messages: Sequence[dict],
    steps: Sequence[tuple[PlannerStep, str]],
    *,
    window: int | None = None,
    canonical: bool = False,
) -> list[dict]:
    """The planner's chat H_i: the initial prompt (o_0), then per step its output and the observation.

    Args:
        initial_messages: The rendered ``craft_planner`` template (system + user with instruction and text).
        steps: ``(planner step, observation text)`` pairs in order.
        window: Keep only the last ``window`` steps (the paper keeps all; a small model's context may not hold
            them). SFT and inference must use the same window.
        canonical: Assistant turns in :func:`render_step`'s layout instead of the model's raw output.

    Returns:
        Fresh message dicts: user turns are observations, assistant turns thought + action (the SFT format:
        loss on assistant turns only).
    """
    kept = list(steps)
    if window is not None:
        kept = kept[len(kept) - window:] if window else []
    messages = [dict(m) for m in initial_messages]
    for step, observation in kept:
        messages.append({"role": "assistant", "content": render_step(step) if canonical else step.raw})
        messages.append({"role": "user", "content": observation})
    return messages


def render_transcript(steps: Sequence[tuple[PlannerStep, str]]) -> str:
    """Steps as the Table 17 text block (the ``[In Context Examples]`` slot of the E.1 prompt)."""
    blocks = []
    for step, observation in steps:
        observation = observation.strip()
        if not observation.upper().startswith("###OBSERVATION"):
            observation = f"###OBSERVATION: {observation}"
        blocks.append(f"{render_step(step)}\n{observation}")
    return "\n".join(blocks)
