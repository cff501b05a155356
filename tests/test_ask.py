"""One generation, one Ask: one bounds table for every edge (each naming its own flag or field), the
one rule for exact rows, and the server's Ask made over its settings without a RunConfig per request."""

import math

import pytest

from specgen.app.ask import Ask, ask_for
from specgen.app.config import RunConfig, build_config
from specgen.app.prompts import Prompt
from specgen.core.constraint import ConstraintSpec
from specgen.core.penalties import Penalties
from specgen.core.sampling import SamplingParams
from specgen.errors import ConfigError
from specgen.serve.requests import RequestError, chat_request

CHAT = {"messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("name,value,flag_words,field_words", [
    ("temperature", -0.5, "--temperature must be >= 0, found -0.5", "temperature expects a value >= 0, found -0.5"),
    ("top_p", 1.5, "--top-p must be in (0, 1], found 1.5", "top_p expects a value in (0, 1], found 1.5"),
    ("repeat_last_n", -2, "--repeat-last-n must be -1 (the whole context), 0 (off) or more, found -2",
     "repeat_last_n expects a value >= -1, found -2"),
    ("seed", 2**32, f"--seed expects a whole number from 0 to {2**32 - 1}, found {2**32}",
     f"seed expects a value in [0, {2**32 - 1}], found {2**32}"),
])
def test_one_table_refuses_the_same_values_at_every_edge_each_naming_its_own(name, value, flag_words, field_words):
    with pytest.raises(ConfigError) as cli:
        build_config(None, {name: value})
    assert str(cli.value) == flag_words
    with pytest.raises(RequestError) as server:
        chat_request({**CHAT, name: value})
    assert (server.value.message, server.value.param) == (field_words, name)


def test_where_the_edges_differed_the_wider_range_holds_at_both():
    """The server refused temperature above 2 and top_k above 2^20; the command line did not."""
    assert build_config(None, {"temperature": 3.0, "top_k": 2**21}).sampling.temperature == 3.0
    request = chat_request({**CHAT, "temperature": 3, "top_k": 2**21})
    assert request.sampling.over(RunConfig().sampling).temperature == 3.0 and request.sampling.over(RunConfig().sampling).top_k == 2**21


def test_a_temperature_that_is_not_a_number_is_refused_on_the_command_line():
    """nan passed the command line's `temperature < 0` test (and inf its >= 0): the table wants finite numbers."""
    for value in (math.nan, math.inf):
        with pytest.raises(ConfigError, match="--temperature must be >= 0"):
            build_config(None, {"temperature": value})


def test_the_servers_ask_takes_the_requests_values_over_its_own_and_keeps_bias_pairs_exact():
    cfg = RunConfig(temperature=0.7, top_k=40, repeat_penalty=1.1, logit_bias="5+1")
    request = chat_request({**CHAT, "top_k": 3, "penalty_last_n": 16, "logit_bias": {"7": 0.1 + 0.2, "9": False}})
    s = request.sampling.over(cfg.sampling)
    assert (s.temperature, s.top_k) == (0.7, 3)
    assert s.penalties == Penalties(1.1, 16, 0.0, 0.0, ((7, 0.1 + 0.2), (9, -math.inf)))
    assert chat_request(CHAT).sampling.over(cfg.sampling) == cfg.sampling


@pytest.mark.parametrize("ask,why", [
    (dict(), None),
    (dict(sampling=SamplingParams(0.8)), None),  # the race needs its contenders' logits only
    (dict(sampling=SamplingParams(0.8, top_k=40, top_p=0.95, min_p=0.05)), None),
    (dict(sampling=SamplingParams(0.8, top_p=0.9)), "top-p without top-k"),  # the nucleus needs the mass
    (dict(sampling=SamplingParams(logit_bias=((3, 1.0),))), "penalties and logit bias"),
    (dict(sampling=SamplingParams(logit_bias=((3, 0.0),))), None),  # a zero bias moves nothing
    (dict(logprobs=0), "logprobs"),
    (dict(constraint=ConstraintSpec("json_object")), "constrained output"),
])
def test_needs_exact_rows_is_one_rule(ask, why):
    a = Ask(Prompt(0, "x"), False, **ask)
    assert (a.why_exact_rows, a.needs_exact_rows) == (why, why is not None)


def test_an_ask_for_a_constrained_prompt_carries_its_whole_constraint():
    class Template:
        chat_template = None

    prompt = Prompt(0, "x", constraint=ConstraintSpec("json_object"))
    with pytest.raises(ValueError, match="make it with ask_for"):
        Ask(prompt, False)
    assert ask_for(Template(), prompt, False, "free").constraint == ConstraintSpec("json_object", "", "free")


def test_the_record_reports_the_temperature_of_the_ask_that_ran_not_the_configs():
    """record() read RunConfig.temperature: an Ask sampled at another (bench's, a server request's)
    was recorded at the config's."""
    from dataclasses import replace

    from fakes import fake_session

    from specgen.app.runner import Runner

    session, cfg = fake_session(with_draft=False)
    runner = Runner(replace(cfg, method="plain", max_tokens=4), session)
    ask = runner.ask(Prompt(0, "a b"))
    assert runner.record(runner.run(ask))["temperature"] == 0.0
    hot = replace(ask, sampling=SamplingParams(temperature=0.7, seed=3))
    assert runner.record(runner.run(hot))["temperature"] == 0.7


def test_the_vocabulary_check_is_one_rule_each_edge_wording_it():
    from specgen.app.ask import check_vocabulary

    with pytest.raises(ConfigError, match=r"logit_bias expects token ids in \[0, 4\), found 4"):
        check_vocabulary(((4, 1.0),), 4)
    with pytest.raises(ConfigError, match=r"logit bias expects at least one token left unbanned, found all 2 "
                                          r"tokens of the vocabulary banned \(-inf\)"):
        check_vocabulary(((0, -math.inf), (1, -math.inf)), 2, "logit bias", "fake", ban="-inf")
    check_vocabulary(((0, -math.inf), (1, 2.0)), 2)


def test_a_seeded_ask_plans_from_the_fixed_curves_whatever_seed_the_models_were_loaded_with():
    """auto's reproducibility was fixed at load from the config's seed (session.py): a server
    started without --seed timed every request into its curves, a request's own seed too."""
    from dataclasses import replace

    from fakes import fake_session

    from specgen.app.ask import ask_for
    from specgen.app.runner import Runner

    session, cfg = fake_session(with_draft=True)
    runner = Runner(replace(cfg, method="auto", max_tokens=12), session)
    clocked = runner.ask(Prompt(0, "a b c"))
    seeded = ask_for(session.target, clocked.prompt, False, "compact", sampling=SamplingParams(0.8, seed=5),
                     max_tokens=12)
    assert not clocked.plans_from_curves and seeded.plans_from_curves
    assert replace(seeded, sampling=replace(seeded.sampling, seed=6)).plans_from_curves  # bench's trial seeds
    before = list(session.fixed_costs.seconds)
    texts = {runner.run(seeded).text for _ in range(2)}
    assert len(texts) == 1 and runner._learning(seeded).drafter.reproducible
    assert not runner._learning(clocked).drafter.reproducible
    assert session.fixed_costs.seconds == before and session.context_for(runner.method, True) is not \
        session.context_for(runner.method, False)


def test_the_server_edge_returns_typed_overrides_and_merging_replaces_the_defaults_fields():
    from dataclasses import replace

    from specgen.app.ask import Overrides

    request = chat_request({**CHAT, "temperature": 1, "penalty_last_n": 8, "seed": -1, "logit_bias": {"3": False},
                            "samplers": ["top_k", "temperature"]})
    assert request.sampling == Overrides(temperature=1.0, repeat_last_n=8, logit_bias=((3, -math.inf),),
                                         samplers=("top_k", "temperature"))
    defaults = SamplingParams(0.5, top_k=40, seed=9)
    assert Overrides(temperature=1.0, repeat_last_n=8).over(defaults) == replace(defaults, temperature=1.0,
                                                                                 repeat_last_n=8)
    assert set(Overrides().given) == set() and Overrides().over(defaults) is not None
    assert set(SamplingParams.__dataclass_fields__) - {"order"} == {f for f in Overrides.__dataclass_fields__} - {
        "samplers"}, "the overrides name every sampling value"


def test_the_flat_settings_split_into_what_loads_the_models_and_what_each_generation_starts_from():
    from specgen.app.config import LOADING, Defaults, Loading

    cfg = build_config(None, {"temperature": 0.5, "stop": ["x"], "logit_bias": "3+1", "threads": 2, "method": "plain"})
    assert cfg.defaults == Defaults(SamplingParams(0.5, logit_bias=((3, 1.0),)), 256, ("x",))
    assert cfg.loading == Loading("gemma-3-270m-f32", "gemma-3-270m-q2_k", "plain", 2, 4096, 0, 0, None, None, None)
    assert not set(LOADING) & {"max_tokens", "stop", "chat", "system", "json_layout", *SamplingParams.__dataclass_fields__}
