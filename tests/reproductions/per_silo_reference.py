"""Independent reference values for the silo studies' band tests, computed with scikit-learn."""
from __future__ import annotations


def logistic_regression_accuracy(clients) -> float:
    """Accuracy over every silo's test rows of a logistic regression fitted on that silo's
    training rows alone (what Local estimates, by a different learner)."""
    from sklearn.linear_model import LogisticRegression

    correct = rows = 0
    for client in clients:
        fit = LogisticRegression(max_iter=3000).fit(client.train.x.flatten(1).numpy(), client.train.y.numpy())
        correct += int((fit.predict(client.test.x.flatten(1).numpy()) == client.test.y.numpy()).sum())
        rows += len(client.test.y)
    return correct / rows
