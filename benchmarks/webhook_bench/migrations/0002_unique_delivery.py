from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("pikku_webhook_bench", "0001_initial"),
    ]

    operations = [
        migrations.AlterField(
            model_name="rawdelivery",
            name="delivery",
            field=models.CharField(max_length=255, unique=True),
        ),
    ]
