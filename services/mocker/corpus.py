"""The built-in English corpus the mocker "generates" from, and its tokenization.

Generated text is a slice of this prose, so responses read as plain English and detokenize
cleanly with the model's real tokenizer. Only the worker reads its local tokenizer file.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenizers import Tokenizer

CORPUS = """\
The river town woke slowly on market days. Before the sun cleared the hills, the baker had \
already lit his ovens, and the smell of bread drifted down the narrow streets toward the water. \
Fishermen pushed their boats out through the mist, calling to one another in low voices, while \
the first carts rolled over the old stone bridge with their loads of apples, cabbages and wool. \
Nobody hurried. The day was long, and there would be time enough for everything that needed \
doing.

At the center of the square stood a clock that had not kept good time for as long as anyone \
could remember. Some said it ran fast in summer and slow in winter, as if it were tired of the \
cold. Others insisted it was perfectly accurate and that the rest of the world had simply \
drifted away from it. The town council had voted three times to repair it, and three times the \
money had been spent on something more urgent: a new roof for the school, a wider road to the \
mill, a wall to hold back the river in the spring floods.

The schoolteacher, a patient woman with ink on her fingers, liked to bring her pupils to the \
square on clear mornings. She would point to the clock and ask them to work out how far it had \
wandered since the day before. The children argued, counted on their fingers, and scratched \
numbers into their slates. In this way they learned arithmetic, but they also learned that a \
careful measurement is worth more than a confident guess, and that two honest people can look \
at the same thing and see it differently.

Down by the water, the ferryman kept a small notebook in which he wrote the height of the \
river every evening. He had done this for forty years, and the pages were filled with columns \
of figures in a small, steady hand. When the engineers came from the city to plan the new \
embankment, they laughed at first at the old man and his notebook. Then they read it, and \
they stopped laughing. His numbers showed every flood and every dry summer, and they matched \
the marks on the bridge to within a finger's width. The engineers copied the whole book before \
they left.

In the afternoons, when the market had quieted, the traders packed what was left of their \
goods and sat together under the plane trees. They talked about prices and weather, about \
children who had moved away and letters that had come back from distant cities. A traveller \
passing through might have thought the conversation aimless, but it was not. In those long, \
unhurried talks the town decided who needed help with the harvest, which roads were safe, and \
whose roof would be mended next. Nothing was written down, and yet nothing was forgotten.

Evening brought the lamplighter, who walked the same route every night with his ladder on his \
shoulder. He knew every lamp by its habits: the one by the chapel that flickered in the wind, \
the one near the inn that always needed more oil, the one at the end of the bridge that the \
boys liked to climb. As the lamps came on one by one, the river caught their light and carried \
it away downstream, toward the sea that most of the townspeople had never seen.

Later, when the streets were empty, the baker banked his fires and the ferryman tied up his \
boat. The clock in the square struck an hour that may or may not have been correct. Somewhere \
a dog barked, and somewhere else a window closed. The town settled into the quiet of the night, \
the way a tired traveller settles into a familiar chair, certain that tomorrow would look very \
much like today, and content that it should.

Years later, the children who had counted the clock's errors grew up and went out into the \
world. Some built bridges and some wrote books; one of them became an engineer who designed \
clocks for railway stations, where every minute mattered. She never forgot the crooked clock \
in the square. When people asked her why she had chosen such exacting work, she would smile \
and say that she had learned early how much trouble a small error can cause, and how much \
patience it takes to find it.

Every spring the river rose, and every spring the town prepared for it in the same way. Sandbags \
were filled in the schoolyard, the ferry was hauled up onto the bank, and the ferryman's \
notebook was passed from hand to hand so that everyone could see how high the water had come \
in other years. Old men remembered floods their grandparents had told them about, and young \
men carried sacks until their backs ached. When the water finally crested and began to fall, \
there was always a supper in the square, with long tables, borrowed chairs and more bread than \
anyone could eat. The clock, as usual, struck the wrong hour, and nobody minded at all.
"""


def load_tokenizer(model_dir: Path) -> Tokenizer:
    """The model's ``tokenizer.json``."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(model_dir / "tokenizer.json"))


def corpus_token_ids(
    model_dir: Path, text: str = CORPUS, *, tokenizer: Tokenizer | None = None
) -> tuple[int, ...]:
    """Tokenize ``text`` with the model's ``tokenizer.json`` (no special tokens added)."""
    tokenizer = tokenizer or load_tokenizer(model_dir)
    ids: list[int] = tokenizer.encode(text, add_special_tokens=False).ids
    if not ids:
        raise ValueError("the mocker corpus tokenized to nothing")
    return tuple(ids)
