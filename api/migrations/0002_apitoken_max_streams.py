from django.core.validators import MinValueValidator
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("api", "0001_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="apitoken",
            name="max_streams",
            field=models.PositiveIntegerField(
                blank=True,
                help_text="Streams its person may have open at once through it; empty: the appliance's default.",
                null=True,
                validators=[MinValueValidator(1)],
            ),
        ),
    ]
