from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="RawDelivery",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("delivery", models.CharField(max_length=255)),
                ("body", models.BinaryField()),
            ],
            options={"db_table": "pikku_bench_webhook_raw"},
        ),
    ]
