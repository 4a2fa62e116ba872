"""Your own data: four clients whose label is the sign of the first of 8 features."""

import numpy as np

import fedjax_het


def four_clients() -> fedjax_het.FederatedData:
    """Clients of 40, 60, 90 and 150 training examples, each with its own 20 test examples."""
    rng = np.random.default_rng(0)
    sizes = [40, 60, 90, 150]
    xs = [rng.normal(size=(n, 8)).astype(np.float32) for n in sizes]
    ys = [(x[:, 0] > 0).astype(np.int32) for x in xs]
    test_xs = [rng.normal(size=(20, 8)).astype(np.float32) for _ in sizes]
    test_ys = [(x[:, 0] > 0).astype(np.int32) for x in test_xs]
    return fedjax_het.FederatedData.from_client_arrays(
        xs, ys, test_xs=test_xs, test_ys=test_ys, num_classes=2, name="mine"
    )


if __name__ == "__main__":
    mine = four_clients()
    print(mine.num_clients, mine.example_shape, mine.train.count.tolist())
