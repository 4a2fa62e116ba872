"""Tests of fedjax_het.data.leaf on tiny LEAF directories written here.

Each directory has two training files (users split across them, LEAF's layout) and one test file
that leaves one user out; expected arrays are rebuilt from the written JSON with plain loops.
"""

import json

import numpy as np
import pytest

from fedjax_het.data import leaf

RNG = np.random.default_rng(0)
# LEAF's Shakespeare symbols, in index order (LEAF's models/utils/language_utils.py ALL_LETTERS).
LEAF_ALPHABET = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"


def write_leaf(root, train: dict, test: dict | None, files: int = 2) -> None:
    """Writes {user: {"x": [...], "y": [...]}} as LEAF JSON, spreading users over ``files``."""
    for split, users in (("train", train), ("test", test)):
        if users is None:
            continue
        (root / split).mkdir(parents=True)
        names = list(users)
        for part in range(files):
            chunk = names[part::files]
            content = {
                "users": chunk,
                "num_samples": [len(users[u]["y"]) for u in chunk],
                "user_data": {u: users[u] for u in chunk},
                "hierarchies": [],
            }
            (root / split / f"all_data_{part}_niid_0_keep_0_{split}_9.json").write_text(
                json.dumps(content)
            )


def femnist_users(sizes: dict[str, int]) -> dict:
    return {
        user: {
            "x": RNG.random((n, 784)).round(4).tolist(),
            "y": RNG.integers(62, size=n).tolist(),
        }
        for user, n in sizes.items()
    }


def shakespeare_users(sizes: dict[str, int], alphabet: str) -> dict:
    def text(length):
        return "".join(RNG.choice(list(alphabet), size=length))

    return {
        user: {"x": [text(80) for _ in range(n)], "y": [text(1) for _ in range(n)]}
        for user, n in sizes.items()
    }


def tweet(words: str) -> list:
    return ["1467810369", "Mon Apr 06 22:19:45 PDT 2009", "NO_QUERY", "someone", words]


def expected_order(train: dict, files: int = 2) -> list[str]:
    """Users in the order LEAF files (sorted by name) list them."""
    names = list(train)
    return [user for part in range(files) for user in names[part::files]]


def test_femnist_images_labels_and_split(tmp_path):
    train = femnist_users({"f0": 3, "f1": 5, "f2": 1, "f3": 4})
    test = femnist_users({"f0": 2, "f1": 1, "f3": 3})  # f2 has no test examples
    write_leaf(tmp_path, train, test)
    data = leaf.load_femnist(tmp_path)
    assert data.num_classes == 62 and data.name == "femnist"
    assert data.example_shape == (28, 28, 1) and data.train.x.dtype == np.float32
    for k, user in enumerate(expected_order(train)):
        x, y = data.train.client(k)
        for row, pixels in enumerate(train[user]["x"]):
            for i in range(784):  # pixel i sits at row i // 28, column i % 28
                assert x[row, i // 28, i % 28, 0] == np.float32(pixels[i])
        assert y.tolist() == train[user]["y"]
        x, y = data.test.client(k)
        assert y.tolist() == test.get(user, {"y": []})["y"]
        assert x.shape == (len(y), 28, 28, 1)


def test_max_clients_keeps_the_first_users(tmp_path):
    train = femnist_users({"a": 2, "b": 2, "c": 3})
    write_leaf(tmp_path, train, femnist_users({"a": 1, "b": 1, "c": 1}))
    data = leaf.load_femnist(tmp_path, max_clients=2)
    assert data.num_clients == 2 and data.test.num_clients == 2
    first_two = expected_order(train)[:2]
    assert data.train.count.tolist() == [len(train[u]["y"]) for u in first_two]


def test_max_clients_still_rejects_users_only_in_test(tmp_path):
    write_leaf(tmp_path, femnist_users({"a": 2, "b": 2}), femnist_users({"a": 1, "z": 1}))
    with pytest.raises(ValueError, match="--t sample"):
        leaf.load_femnist(tmp_path, max_clients=1)


def test_no_test_folder_gives_no_test_split(tmp_path):
    write_leaf(tmp_path, femnist_users({"a": 2, "b": 1}), None)
    assert leaf.load_femnist(tmp_path).test is None
    write_leaf(tmp_path / "s", {"u": {"x": [tweet("hi")], "y": [1]}}, None, files=1)
    assert leaf.load_sent140(tmp_path / "s").test is None


def test_shakespeare_characters_map_to_leaf_alphabet_positions(tmp_path):
    train = shakespeare_users({"s0": 4, "s1": 2, "s2": 3}, LEAF_ALPHABET)
    train["s1"]["x"][0] = "é{" + train["s1"]["x"][0][2:]  # neither is in the alphabet
    train["s2"]["y"][1] = "%"
    test = shakespeare_users({"s0": 1, "s2": 2}, LEAF_ALPHABET)
    write_leaf(tmp_path, train, test)
    data = leaf.load_shakespeare(tmp_path)
    assert data.num_classes == 81 and data.name == "shakespeare"

    def ids(text):
        return [LEAF_ALPHABET.index(c) if c in LEAF_ALPHABET else 80 for c in text]

    for k, user in enumerate(expected_order(train)):
        x, y = data.train.client(k)
        assert x.dtype == np.int32 and x.shape == (len(train[user]["x"]), 80)
        assert x.tolist() == [ids(text) for text in train[user]["x"]]
        assert y.tolist() == ids("".join(train[user]["y"]))
        x, y = data.test.client(k)
        assert y.tolist() == ids("".join(test.get(user, {"y": []})["y"]))
        assert x.shape == (len(y), 80)


def test_shakespeare_rejects_windows_of_another_length(tmp_path):
    write_leaf(tmp_path, {"s": {"x": ["short"], "y": ["a"]}}, None)
    with pytest.raises(ValueError, match="80 characters"):
        leaf.load_shakespeare(tmp_path)


def test_sent140_vocabulary_from_training_tweets_and_padding(tmp_path):
    train = {
        "u0": {"x": [tweet("I love it"), tweet("love love you")], "y": [1, 1]},
        "u1": {"x": [tweet("i HATE mondays so much really truly")], "y": [0]},
        "u2": {"x": [tweet("so it goes")], "y": [0]},
    }
    test = {"u0": {"x": [tweet("unseen love")], "y": [1]}}
    write_leaf(tmp_path, train, test)
    data = leaf.load_sent140(tmp_path, seq_len=5, max_vocab=4)
    # Training token counts: love 3, i 2, it 2, so 2, then single words (alphabetical first).
    vocabulary = {"love": 2, "i": 3, "it": 4, "so": 5}
    assert data.num_classes == 2 and data.train.x.shape[1:] == (5,)

    def ids(text):
        tokens = text.lower().split()[:5]
        return [vocabulary.get(t, 1) for t in tokens] + [0] * (5 - len(tokens))

    for k, user in enumerate(expected_order(train)):
        x, y = data.train.client(k)
        assert x.tolist() == [ids(row[4]) for row in train[user]["x"]]
        assert y.tolist() == train[user]["y"]
    x, y = data.test.client(expected_order(train).index("u0"))
    assert x.tolist() == [ids("unseen love")] and y.tolist() == [1]


def test_word_vocabulary_ranks_by_count_then_alphabetically():
    assert leaf.word_vocabulary(["b a c", "c b", "c"]) == ["c", "b", "a"]
    assert leaf.word_vocabulary(["z y x"], max_size=2) == ["x", "y"]


@pytest.mark.parametrize(
    "train,test,match",
    [
        ({"a": 2}, {"a": 1, "stranger": 1}, "--t sample"),
        ({"a": 2, "b": 0}, None, "no training examples"),
    ],
)
def test_bad_user_layouts_raise(tmp_path, train, test, match):
    write_leaf(tmp_path, femnist_users(train), None if test is None else femnist_users(test))
    with pytest.raises(ValueError, match=match):
        leaf.load_femnist(tmp_path)


def test_inconsistent_files_raise(tmp_path):
    (tmp_path / "train").mkdir()
    content = {
        "users": ["a"],
        "num_samples": [3],
        "user_data": {"a": {"x": [[0.0] * 784], "y": [1]}},
    }
    (tmp_path / "train" / "d.json").write_text(json.dumps(content))
    with pytest.raises(ValueError, match="must agree"):
        leaf.load_femnist(tmp_path)
    (tmp_path / "train" / "d.json").write_text(json.dumps({"users": []}))
    with pytest.raises(ValueError, match="lacks the LEAF keys"):
        leaf.load_femnist(tmp_path)
    with pytest.raises(ValueError, match="train/ folder"):
        leaf.load_femnist(tmp_path / "nowhere")


def test_duplicate_users_across_files_raise(tmp_path):
    users = femnist_users({"a": 1})
    write_leaf(tmp_path, {**users}, None, files=1)
    (tmp_path / "train" / "z.json").write_text(
        json.dumps({"users": ["a"], "num_samples": [1], "user_data": users})
    )
    with pytest.raises(ValueError, match="appears twice"):
        leaf.load_femnist(tmp_path)


def test_loaders_are_registered_by_name():
    assert leaf.LOADERS == {
        "femnist": leaf.load_femnist,
        "shakespeare": leaf.load_shakespeare,
        "sent140": leaf.load_sent140,
    }
