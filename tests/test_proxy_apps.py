"""The proxy as an app uses it: the official openai client, the default model, sentinel at ratio 3, documents
that a retriever with overlapping chunks sends several times, answers that sit in a sentence naming its subject
only by a pronoun. Each case must be answered, and the compression block must say what happened."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from serving.app import ProxySettings, create_app, serve_in_thread

MODEL = "smollm2-135m-instruct"
FILLER = [{"title": "Weather", "text": "It rained in Oslo on Monday. The sun came out on Tuesday afternoon."},
          {"title": "Trains", "text": "The night train leaves at ten. It stops in six towns before the coast."},
          {"title": "Pets", "text": "Many people keep cats. Dogs are popular too."}]


def person(title: str, text: str) -> list[dict]:
    return [{"title": title, "text": text + " The weather there is mild."}, *FILLER]


# (documents, question, what the reply must contain): each answer sits in a sentence that names its subject only
# by a pronoun. The 135M default decoder answers many other phrasings wrongly even from the full, uncompressed
# documents (it often names the town of the first sentence): these are phrasings it answers from the evidence.
CASES = {
    "employer": (person("Ines Duarte", "Ines Duarte moved to Porto in 2010. She works as a pilot for the airline "
                        "Azul Norte."), "Which airline does Ines Duarte fly for?", "Azul"),
    "workplace": (person("Kenji Mori", "Kenji Mori trained as a chef in Osaka. He now cooks at the restaurant Hikari "
                         "in Paris."), "At which restaurant does Kenji Mori cook?", "Hikari"),
    "date": (person("Harbor Bridge", "The Harbor Bridge crosses the bay at Kessel. It opened to traffic in 1932."),
             "In which year did the Harbor Bridge open to traffic?", "1932"),
    "pets": (person("Tom Okafor", "Tom Okafor grew up in Lagos. He has a dog named Bruno and a parrot."),
             "What is the name of Tom Okafor's dog?", "Bruno"),
}


def ask(oa: openai.OpenAI, question: str, docs: list, **compression):
    r = oa.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": question}], max_tokens=24,
                                   temperature=0, extra_body={"documents": docs,
                                                              "compression": {"method": "sentinel", **compression}})
    return r.choices[0].message.content, r.model_extra["compression"]


@pytest.fixture(scope="module")
def oa(smol_backend) -> Iterator[openai.OpenAI]:
    with serve_in_thread(create_app(ProxySettings(method="sentinel", ratio=3.0), backend=smol_backend)) as base:
        yield openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.mark.real_model
@pytest.mark.parametrize("case", ["employer", "workplace", "date"])
def test_repeated_chunks_are_merged_and_the_app_is_answered(oa, case):
    """Every document three times at ratio 3: the repeats are merged, what is left fits the budget whole."""
    docs, question, answer = CASES[case]
    reply, block = ask(oa, question, docs * 3, ratio=3)
    assert answer in reply, (reply, block)
    assert (block["duplicates"], block["stopped_by"]) == (2 * len(docs), "input"), block
    assert block["tokens_after"] <= block["tokens_before"] / 3


@pytest.mark.real_model
@pytest.mark.parametrize("case", ["pets", "date"])
def test_a_tight_budget_keeps_the_pronoun_sentence_and_says_why(oa, case):
    """At ratio 6 the selection bites: the answer's sentence ("He has a dog named Bruno") is kept though it
    names Tom only as "He", and the early stop is a choice the request makes visible."""
    docs, question, answer = CASES[case]
    reply, block = ask(oa, question, docs * 3, ratio=6)
    assert answer in reply and block["stopped_by"] == "budget", (reply, block)
    assert block["tokens_before"] / 6 * 0.6 <= block["tokens_after"] <= block["tokens_before"] / 6  # the budget, used
    _, stop = ask(oa, question, docs * 3, ratio=6, early_stop=True)
    assert stop["stopped_by"] in ("min_score", "budget") and stop["tokens_after"] <= block["tokens_after"]
