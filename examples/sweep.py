"""Three seeds of FedAvg on LEAF Synthetic(0.5, 0.5), run as one vmapped program."""

import fedjax_het
from fedjax_het import models
from fedjax_het.algorithms import fedavg
from fedjax_het.data.catalog import leaf_synthetic
from fedjax_het.sampling import uniform

data = leaf_synthetic(num_clients=20, alpha=0.5, beta=0.5)
seeds = (0, 1, 2)
cells = fedjax_het.sweep(  # one History per (system, seed) cell
    data,
    models.logistic_regression(data.example_shape, data.num_classes),
    fedavg(),
    uniform(num_clients=20, cohort_size=5),
    rounds=10,
    seeds=seeds,
    work=fedjax_het.LocalWork(batch_size=10, epochs=1),
    eval_every=10,
    progress=False,
)
for seed, history in zip(seeds, cells):
    last = history.metrics[-1]
    print(
        f"seed {seed}: round {last['round']}, train loss {last['train_loss']:.4f}, "
        f"test accuracy {last['test_accuracy']:.4f}"
    )
