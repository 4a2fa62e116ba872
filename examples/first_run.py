"""FedAvg on LEAF Synthetic(0.5, 0.5): 20 clients, 5 a round, 20 rounds."""

import fedjax_het
from fedjax_het import models
from fedjax_het.algorithms import fedavg
from fedjax_het.data.catalog import leaf_synthetic
from fedjax_het.sampling import uniform

data = leaf_synthetic(num_clients=20, alpha=0.5, beta=0.5)
history = fedjax_het.run(
    data,
    fedjax_het.Training(
        models.logistic_regression(data.example_shape, data.num_classes),
        fedavg(),
        uniform(num_clients=20, cohort_size=5),
        rounds=20,
        work=fedjax_het.LocalWork(batch_size=10, epochs=1),
        hyper={"client_lr": 0.1},
        eval_every=10,
    ),
    output=fedjax_het.Output(progress=False),  # writes nothing: give out_dir to keep results
)
for m in history.metrics:  # one dict per evaluation
    print(f"round {m['round']}: test accuracy {m['test_accuracy']:.4f}")
